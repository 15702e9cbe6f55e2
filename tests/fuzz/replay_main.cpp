// Replays inputs through the fuzz harnesses without libFuzzer (the regular build's CTest entries
// fuzz_replay_<harness>): `axengine_fuzz_replay HARNESS PATH...` runs every file under each PATH (a file or a
// directory, recursively, in sorted order) through HARNESS. A finding aborts the process after naming the
// input; clean rejections and accepted inputs pass. `--list` prints the harness names.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "harness.hpp"

namespace fs = std::filesystem;

int main(int argc, char** argv) {
  const auto& all = ax::fuzz::registered();
  if (argc >= 2 && std::strcmp(argv[1], "--list") == 0) {
    for (const auto& e : all) std::printf("%s\n", e.name);
    return 0;
  }
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s HARNESS PATH... | --list\n", argv[0]);
    return 2;
  }
  auto it = std::find_if(all.begin(), all.end(), [&](const auto& e) { return std::strcmp(e.name, argv[1]) == 0; });
  if (it == all.end()) {
    std::fprintf(stderr, "%s: no harness '%s' (--list names them)\n", argv[0], argv[1]);
    return 2;
  }
  std::vector<fs::path> inputs;
  for (int i = 2; i < argc; ++i) {
    std::error_code ec;
    if (fs::is_directory(argv[i], ec)) {
      for (const auto& e : fs::recursive_directory_iterator(argv[i]))
        if (e.is_regular_file()) inputs.push_back(e.path());
    } else if (fs::is_regular_file(argv[i], ec)) {
      inputs.push_back(argv[i]);
    } else {
      std::fprintf(stderr, "%s: %s is neither a file nor a directory\n", argv[0], argv[i]);
      return 2;
    }
  }
  std::sort(inputs.begin(), inputs.end());
  if (inputs.empty()) {
    std::fprintf(stderr, "%s: no inputs to replay for %s\n", argv[0], it->name);
    return 1;  // a replay that runs nothing proves nothing
  }
  std::size_t accepted = 0;
  for (const auto& p : inputs) {
    std::ifstream in(p, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::printf("%s: %s (%zu bytes): ", it->name, p.c_str(), bytes.size());
    std::fflush(stdout);  // named before it runs: a finding aborts
    const bool ok =
        ax::fuzz::run_guarded(it->name, it->body, reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size());
    std::printf("%s\n", ok ? "accepted" : "rejected");
    accepted += ok;
  }
  std::printf("%s: replayed %zu inputs (%zu accepted, %zu rejected cleanly), no finding\n", it->name, inputs.size(),
              accepted, inputs.size() - accepted);
  // Every seed corpus holds valid inputs: none accepted means the harness itself is broken (wrong paths, a
  // setup that rejects everything), and a replay of it would prove nothing.
  if (accepted == 0) {
    std::fprintf(stderr, "%s: no input was accepted; the harness cannot be reaching its parser\n", it->name);
    return 1;
  }
  return 0;
}
