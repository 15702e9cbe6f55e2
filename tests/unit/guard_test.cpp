// The CTest registration keeps names whole: this case's name has every character that once split a name
// (';' is CMake's list separator) or a doctest filter (',' and '\'). Its entry passes --ax-expect, so the
// entry fails unless exactly this case ran; the case checks that it ran under its full name.
#include <doctest/doctest.h>

#include <string>

std::string ax_test_current_name();  // tests/unit/main.cpp

TEST_CASE("guard: a name with ; , and \\ still runs; exactly once, as itself") {
  CHECK(ax_test_current_name() == "guard: a name with ; , and \\ still runs; exactly once, as itself");
}
