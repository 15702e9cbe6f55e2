// The crash-point facility (axengine/crash_point.hpp) and the atomic directory writer, in forked children:
// the k-th arrival kills, the trace lists every point, a malformed hook is an error naming the variable, and a
// directory replaced at any point is the old version or the new one, whole.
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <functional>

#include "atomic_dir.hpp"
#include "axengine/crash_point.hpp"
#include "axengine/error.hpp"
#include "axengine/safetensors.hpp"
#include "unit/cli_util.hpp"

namespace fs = std::filesystem;

namespace {

// Runs `body` in a forked child with the hooks armed; returns the child's wait status.
int in_child(const std::string& crash_at, const std::string& trace, const std::function<void()>& body) {
  pid_t pid = ::fork();
  if (pid == 0) {
    try {
      ax::set_crash_points_for_test(crash_at, trace);
      body();
    } catch (...) {
      ::_exit(3);
    }
    ::_exit(0);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return status;
}

bool killed(int status) { return WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL; }

}  // namespace

TEST_CASE("crash points: the armed point kills at its k-th arrival and the trace lists every point reached") {
  auto dir = ax::test::scratch_dir("crash_point");
  const fs::path trace = dir / "trace";
  auto three = [] {
    ax::crash_point("unit", "a");
    ax::crash_point("unit", "b");
    ax::crash_point("unit", "a");
  };
  CHECK(killed(in_child("unit.a@2", trace.string(), three)));
  CHECK(ax::test::lines_of(trace) == std::vector<std::string>{"unit.a", "unit.b", "unit.a"});
  fs::remove(trace);
  CHECK(killed(in_child("unit.b", trace.string(), three)));  // @1 by default
  CHECK(ax::test::lines_of(trace) == std::vector<std::string>{"unit.a", "unit.b"});
  fs::remove(trace);
  int status = in_child("unit.a@3", trace.string(), three);  // never reached a third time
  CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 0));
  CHECK(ax::test::lines_of(trace).size() == 3);
  // Malformed: an error naming the variable, at the first point.
  for (const char* bad : {"unit.a@0", "unit.a@x", "nodot", "unit.a@"}) {
    CAPTURE(bad);
    ax::set_crash_points_for_test(bad, "");
    CHECK_THROWS_WITH_AS(ax::crash_point("unit", "a"), doctest::Contains("AXENGINE_TEST_CRASH_AT='"), ax::UsageError);
  }
  ax::set_crash_points_for_test("", "");
  CHECK_NOTHROW(ax::crash_point("unit", "a"));
  ax::test::remove_tree(dir);
}

TEST_CASE("atomic directory: replacing a directory, a crash at any point leaves the old version or the new, whole") {
  auto root = ax::test::scratch_dir("atomic_dir");
  const fs::path dest = root / "d";
  auto write_version = [&](const std::string& v) {
    ax::AtomicDir d(dest.string(), "unit_dir");
    ax::safetensors::write_file_atomic(d.path() + "/a.txt", "a " + v, "unit_dir");
    ax::safetensors::write_file_atomic(d.path() + "/b.txt", "b " + v, "unit_dir");
    d.commit();
  };
  write_version("old");
  const auto old_bytes = ax::test::tree_bytes(dest);
  const fs::path trace = root / "trace";
  REQUIRE(WIFEXITED(in_child("", trace.string(), [&] { write_version("new"); })));
  const auto new_bytes = ax::test::tree_bytes(dest);
  CHECK(new_bytes.at("a.txt") == "a new");
  const auto points = ax::test::lines_of(trace);
  CHECK(points.size() == 2 * 6 + 4);  // six per file, four for the directory
  for (std::size_t i = 0; i < points.size(); ++i) {
    const int k = static_cast<int>(std::count(points.begin(), points.begin() + static_cast<std::ptrdiff_t>(i) + 1, points[i]));
    CAPTURE(points[i]);
    CAPTURE(k);
    write_version("old");
    CHECK(killed(in_child(points[i] + "@" + std::to_string(k), "", [&] { write_version("new"); })));
    auto got = ax::test::tree_bytes(dest);
    CHECK((got == old_bytes || got == new_bytes));
    write_version("new");  // the next writer cleans up what the crash left
    CHECK(ax::test::tree_bytes(dest) == new_bytes);
    CHECK_FALSE(fs::exists(root / ".tmp-d"));
  }
  ax::test::remove_tree(root);
}
