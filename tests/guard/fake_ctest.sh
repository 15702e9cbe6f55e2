#!/bin/sh
# Stands in for `ctest -N` in the guard's own test: lists one entry only, as a registration that lost the
# other cases would, so tests/guard/check_registration.cmake must fail.
echo "Test project (fake)"
echo "  Test   #1: guard: a name with ; , and \\ still runs; exactly once, as itself"
echo
echo "Total Tests: 1"
