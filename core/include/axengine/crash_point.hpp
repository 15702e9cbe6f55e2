// Crash points: named places in the atomic writers (checkpoints, adapters, merged and initialised model
// directories, the prepared-data cache, the tuning cache, reports) and in a training step, where a test can
// make the process die with SIGKILL, receive a stop signal, pause, or see a write fail, so that "whatever
// moment the process dies or is stopped, what is on disk is usable" is tested at every step of every writer
// instead of at random wall-clock moments.
//
// A point is named "<writer>.<step>", the step saying what has just been done, e.g. "checkpoint.dir_renamed".
// Test hooks (environment, read once, when libaxengine loads; <k> >= 1, default 1):
//   AXENGINE_TEST_CRASH_AT=<name>[@<k>]  die with SIGKILL the k-th time point <name> is reached
//   AXENGINE_TEST_CRASH_TRACE=<file>     append the name of every point reached, one a line (the point a crash
//                                        happens at is appended before dying), so a test can enumerate them
//   AXENGINE_TEST_SIGNAL_AT=<name>[@<k>][:INT|TERM|USR1][,...]  raise that signal (default TERM) in this process
//                                        at the k-th arrival; several comma-separated points, each once
//   AXENGINE_TEST_PAUSE_AT=<name>[@<k>]  at the k-th arrival, say "AXENGINE_TEST_PAUSE_AT: paused at <name>
//                                        (pid N)" on stderr and wait until a stop signal was received
//                                        (stop_signal.hpp) before going on: a test can act on a process held there
//   AXENGINE_TEST_WRITE_FAIL_AT=<name>[@<k>]  write_fails_here() is true at the k-th arrival at <name>: the
//                                        writer then fails as on a full disk (a short write, then ENOSPC)
// None set: a point costs one test of a flag.
#pragma once
#include <string>
#include <string_view>

namespace ax {

// Dies here (SIGKILL), raises a signal or pauses when this is an armed point's k-th arrival; records the point
// when tracing. Throws UsageError when a hook variable is malformed.
void crash_point(std::string_view writer, std::string_view step);

// True at the k-th arrival at point <writer>.<step> when AXENGINE_TEST_WRITE_FAIL_AT arms it (the point is
// also passed as by crash_point). Writers that must survive a full disk call it before writing.
bool write_fails_here(std::string_view writer, std::string_view step);

// For a test's forked child, which cannot set the environment before the first read: arms the hooks as the
// two variables would ("" for unset) and resets the arrival counts; the other hooks are disarmed.
void set_crash_points_for_test(const std::string& crash_at, const std::string& trace_file);
// The same for one hook variable by name (AXENGINE_TEST_SIGNAL_AT, ..._PAUSE_AT, ..._WRITE_FAIL_AT), the others
// kept as they are.
void set_test_hook_for_test(const std::string& variable, const std::string& value);

}  // namespace ax
