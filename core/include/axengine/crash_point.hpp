// Crash points: named places in the atomic writers (checkpoints, adapters, merged and initialised model
// directories, the prepared-data cache, the tuning cache, reports) where a crash-safety test can make the
// process die with SIGKILL, so that "whatever moment the process dies, what is on disk is usable" is tested
// at every step of every writer instead of at random wall-clock moments.
//
// A point is named "<writer>.<step>", the step saying what has just been done, e.g. "checkpoint.dir_renamed".
// Test hooks (environment, read once, when libaxengine loads):
//   AXENGINE_TEST_CRASH_AT=<name>[@<k>]  die with SIGKILL the k-th time point <name> is reached (k >= 1, default 1)
//   AXENGINE_TEST_CRASH_TRACE=<file>     append the name of every point reached, one a line (the point a crash
//                                        happens at is appended before dying), so a test can enumerate them
// Neither set: a point costs one test of a flag.
#pragma once
#include <string>
#include <string_view>

namespace ax {

// Dies here (SIGKILL) when this is the armed point's k-th arrival; records the point when tracing.
// Throws UsageError when AXENGINE_TEST_CRASH_AT is malformed.
void crash_point(std::string_view writer, std::string_view step);

// For a test's forked child, which cannot set the environment before the first read: arms the hooks as the
// two variables would ("" for unset) and resets the arrival counts.
void set_crash_points_for_test(const std::string& crash_at, const std::string& trace_file);

}  // namespace ax
