// The doctest main of the test executables, with the guard that keeps CTest honest.
//
// A run whose filters match no test case fails (exit 1): a filter that selects nothing is a broken
// registration, never a pass. `--ax-expect=NAME` (added to every CTest entry by cmake/AxDoctestTests.cmake)
// further requires that exactly one test case ran and that it is NAME, so an entry can neither run nothing
// nor run more than its own case.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

namespace {

std::vector<std::string> g_started;  // names of the test cases that ran
bool g_query = false;               // --list-test-cases, --help, --version, --count...

struct Guard : doctest::IReporter {
  explicit Guard(const doctest::ContextOptions&) {}
  void report_query(const doctest::QueryData&) override { g_query = true; }
  void test_run_start() override {}
  void test_run_end(const doctest::TestRunStats&) override {}
  void test_case_start(const doctest::TestCaseData& d) override { g_started.emplace_back(d.m_name); }
  void test_case_reenter(const doctest::TestCaseData&) override {}
  void test_case_end(const doctest::CurrentTestCaseStats&) override {}
  void test_case_exception(const doctest::TestCaseException&) override {}
  void subcase_start(const doctest::SubcaseSignature&) override {}
  void subcase_end() override {}
  void log_assert(const doctest::AssertData&) override {}
  void log_message(const doctest::MessageData&) override {}
  void test_case_skipped(const doctest::TestCaseData&) override {}
};
REGISTER_LISTENER("axengine_guard", 1, Guard);

}  // namespace

std::string ax_test_current_name() { return g_started.empty() ? std::string() : g_started.back(); }

int main(int argc, char** argv) {
  constexpr const char* kExpect = "--ax-expect=";
  std::optional<std::string> expect;
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    if (i > 0 && std::strncmp(argv[i], kExpect, std::strlen(kExpect)) == 0) expect = argv[i] + std::strlen(kExpect);
    else args.push_back(argv[i]);
  }
  doctest::Context context(static_cast<int>(args.size()), args.data());
  int rc = context.run();
  if (g_query || context.shouldExit()) return rc;
  if (g_started.empty()) {
    std::fprintf(stderr, "[axengine guard] no test case ran: the filters match nothing (a misregistered test?)\n");
    return 1;
  }
  if (expect && (g_started.size() != 1 || g_started[0] != *expect)) {
    std::fprintf(stderr, "[axengine guard] expected exactly the test case \"%s\", but %zu ran:\n", expect->c_str(), g_started.size());
    for (const auto& n : g_started) std::fprintf(stderr, "  \"%s\"\n", n.c_str());
    return 1;
  }
  return rc;
}
