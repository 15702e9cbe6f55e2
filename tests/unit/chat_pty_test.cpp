// `axengine chat` on a terminal edits its lines (libedit): driven through a pseudo-terminal (forkpty), a left
// arrow moves into the typed line and an insertion lands there, and the up arrow recalls the previous line. The
// answers (stdout, redirected to a file) equal `generate`'s for the conversation those edited lines make. Each
// step waits for the chat's "> " prompt before typing, so nothing depends on timing.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <poll.h>
#include <pty.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "unit/cli_util.hpp"

namespace fs = std::filesystem;

#ifdef AXENGINE_HAVE_LIBEDIT
namespace {

// Reads the terminal's output until it holds `count` prompts; false after 60 s without new output (a broken
// chat), so the test fails instead of hanging.
bool wait_for_prompts(int master, std::string& seen, std::size_t count) {
  auto prompts = [&] {
    std::size_t n = 0;
    for (std::size_t at = seen.find("> "); at != std::string::npos; at = seen.find("> ", at + 2)) ++n;
    return n;
  };
  while (prompts() < count) {
    pollfd p{master, POLLIN, 0};
    if (::poll(&p, 1, 60000) <= 0) return false;
    char buf[4096];
    const ssize_t n = ::read(master, buf, sizeof buf);
    if (n <= 0) return false;
    seen.append(buf, static_cast<std::size_t>(n));
  }
  return true;
}

void type(int master, const std::string& keys) { REQUIRE(::write(master, keys.data(), keys.size()) == static_cast<ssize_t>(keys.size())); }

}  // namespace
#endif

TEST_CASE("cli chat on a terminal: the left arrow edits the line, the up arrow recalls the previous one") {
#ifndef AXENGINE_HAVE_LIBEDIT
  MESSAGE("skipped: this build has no libedit (Debian: libedit-dev), so chat reads plain lines");
#else
  auto dir = ax::test::scratch_dir("chat_pty");
  ax::test::make_tiny_llama(dir / "model");
  std::ofstream(dir / "model" / "chat_template.jinja")
      << "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
         "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
  const std::string bin = std::string(AXENGINE_BIN_DIR) + "/axengine", model = (dir / "model").string();
  const std::string answers = (dir / "answers.txt").string();
  int master = -1;
  const pid_t pid = ::forkpty(&master, nullptr, nullptr, nullptr);
  REQUIRE(pid >= 0);
  if (pid == 0) {  // stdin and stderr on the terminal; the answers to a file
    const int fd = ::open(answers.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 1);
    ::setenv("TERM", "xterm", 1);
    ::setenv("OMP_NUM_THREADS", "1", 1);
    ::setenv("HOME", dir.c_str(), 1);  // no ~/.editrc of the machine's
    ::execl(bin.c_str(), bin.c_str(), "chat", "--model", model.c_str(), "--max-new-tokens", "6", "--stop", "\n",
            static_cast<char*>(nullptr));
    ::_exit(127);
  }
  std::string seen;
  REQUIRE(wait_for_prompts(master, seen, 1));
  type(master, "ab\x1b[DX\r");  // "ab", left arrow, "X": the line is "aXb"
  REQUIRE(wait_for_prompts(master, seen, 2));
  type(master, "\x1b[A\r");  // up arrow: "aXb" again
  REQUIRE(wait_for_prompts(master, seen, 3));
  type(master, "/exit\r");
  int status = 0;
  ::waitpid(pid, &status, 0);
  ::close(master);
  INFO(seen);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  const auto got = ax::test::lines_of(answers);
  REQUIRE(got.size() == 2);

  // generate's answers for the conversation of the edited lines.
  const nlohmann::json user = {{"role", "user"}, {"content", "aXb"}};
  std::ofstream(dir / "conv.jsonl") << nlohmann::json{{"messages", {user}}}.dump() << "\n"
                                    << nlohmann::json{{"messages", {user, {{"role", "assistant"}, {"content", got[0]}}, user}}}.dump()
                                    << "\n";
  REQUIRE(ax::test::run({"generate", "--model", model, "--input", (dir / "conv.jsonl").string(), "--output",
                         (dir / "conv.out").string(), "--max-new-tokens", "6", "--stop", "\n"},
                        dir / "conv.log") == 0);
  const auto want = ax::test::lines_of(dir / "conv.out");
  REQUIRE(want.size() == 2);
  CHECK(nlohmann::json::parse(want[0])["text"] == got[0]);
  CHECK(nlohmann::json::parse(want[1])["text"] == got[1]);
  // A line typed as is would differ: "ab^[[DX" is another prompt (guards the comparison above).
  std::ofstream(dir / "raw.jsonl") << nlohmann::json{{"messages", {{{"role", "user"}, {"content", "ab\x1b[DX"}}}}}.dump() << "\n";
  REQUIRE(ax::test::run({"generate", "--model", model, "--input", (dir / "raw.jsonl").string(), "--output",
                         (dir / "raw.out").string(), "--max-new-tokens", "6", "--stop", "\n"},
                        dir / "raw.log") == 0);
  CHECK(nlohmann::json::parse(ax::test::lines_of(dir / "raw.out")[0])["prompt_tokens"] !=
        nlohmann::json::parse(want[0])["prompt_tokens"]);
  ax::test::remove_tree(dir);
#endif
}
