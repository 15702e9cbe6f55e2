// The shared frame of the fuzz harnesses (one .cpp per parser of untrusted input, tests/fuzz/*.cpp).
//
// A harness body receives the raw input bytes, writes them where the parser reads them (a file in a scratch
// directory, or several files: see split_parts) and calls the parser exactly as the engine does. Clean
// rejection is an ax::UsageError or ax::RuntimeError (a message naming the file); anything else that escapes
// — another exception type, a crash, a sanitizer report, a hang — is a bug.
//
// Built two ways (tests/fuzz/CMakeLists.txt):
//   - AXENGINE_FUZZ_TARGET defined: one libFuzzer executable per harness (clang, -fsanitize=fuzzer), the body
//     becomes LLVMFuzzerTestOneInput;
//   - otherwise: every harness in one replay executable (replay_main.cpp, any compiler) that runs committed
//     corpus and regression inputs through the same bodies, so crashers stay fixed in the normal CTest suite.
#pragma once
#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>
#include <string_view>
#include <vector>

namespace ax::fuzz {

using Body = void (*)(const std::uint8_t* data, std::size_t size);

// Runs `body`, treating ax::UsageError / ax::RuntimeError as the parser's clean rejection of bad input
// (returns false; true when the input was accepted); any other exception is printed with its type and the
// process aborts (a finding).
bool run_guarded(const char* harness, Body body, const std::uint8_t* data, std::size_t size);

// For a harness's fixed setup (loading the test tokenizers): a failure there is the harness's own bug, which
// must not pass as "every input rejected". Prints and aborts.
[[noreturn]] void setup_failed(const char* what, const std::exception& e);

// This process's scratch directory (created once, under $AXENGINE_FUZZ_TMP, else /dev/shm when present, else
// the system temp dir; removed at exit). `fresh_dir(name)` is an empty subdirectory of it.
const std::string& scratch();
std::string fresh_dir(const std::string& name);
void write_file(const std::string& path, std::string_view bytes);

// Multi-file inputs: the parts between separator lines "\n#-#-#\n" (kSeparator). Seeds stay readable and
// libFuzzer learns the separator from the dictionary (tests/fuzz/dict/common.dict).
inline constexpr std::string_view kSeparator = "\n#-#-#\n";
std::vector<std::string_view> split_parts(std::string_view input, std::size_t max_parts);

// Silences the engine's log (warnings about skipped rows would flood the fuzzer's output) once per process.
void quiet_logs();

struct Registration {
  Registration(const char* name, Body body);
};
struct Entry {
  const char* name;
  Body body;
};
const std::vector<Entry>& registered();

}  // namespace ax::fuzz

// AX_FUZZ_HARNESS(name) { ... body using `data` and `size` ... }
#ifdef AXENGINE_FUZZ_TARGET
#define AX_FUZZ_HARNESS(name)                                                           \
  static void ax_fuzz_body_##name(const std::uint8_t* data, std::size_t size);          \
  extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {   \
    (void)ax::fuzz::run_guarded(#name, ax_fuzz_body_##name, data, size);                \
    return 0;                                                                           \
  }                                                                                     \
  static void ax_fuzz_body_##name(const std::uint8_t* data, std::size_t size)
#else
#define AX_FUZZ_HARNESS(name)                                                           \
  static void ax_fuzz_body_##name(const std::uint8_t* data, std::size_t size);          \
  static const ax::fuzz::Registration ax_fuzz_reg_##name(#name, ax_fuzz_body_##name);   \
  static void ax_fuzz_body_##name(const std::uint8_t* data, std::size_t size)
#endif
