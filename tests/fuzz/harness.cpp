#include "harness.hpp"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <typeinfo>

#include <cxxabi.h>

#include "axengine/error.hpp"
#include "axengine/log.hpp"

namespace ax::fuzz {
namespace fs = std::filesystem;

namespace {

std::string type_name_of(const std::exception& e) {
  int status = 0;
  char* name = abi::__cxa_demangle(typeid(e).name(), nullptr, nullptr, &status);
  std::string out = status == 0 && name ? name : typeid(e).name();
  std::free(name);
  return out;
}

std::vector<Entry>& table() {
  static std::vector<Entry> all;
  return all;
}

// The scratch path lives on the heap and is never freed: the exit handler that removes the directory may run
// after static strings are destroyed.
const std::string* scratch_path = nullptr;

void remove_scratch() {
  std::error_code ec;
  if (scratch_path) fs::remove_all(*scratch_path, ec);
}

}  // namespace

bool run_guarded(const char* harness, Body body, const std::uint8_t* data, std::size_t size) {
  quiet_logs();
  try {
    body(data, size);
    return true;
  } catch (const ax::UsageError&) {
    return false;
  } catch (const ax::RuntimeError&) {
    return false;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "\n%s: input escaped as %s (not ax::UsageError/RuntimeError): %s\n", harness,
                 type_name_of(e).c_str(), e.what());
    std::abort();
  } catch (...) {
    std::fprintf(stderr, "\n%s: input escaped as an exception of unknown type\n", harness);
    std::abort();
  }
}

void setup_failed(const char* what, const std::exception& e) {
  std::fprintf(stderr, "fuzz harness setup failed: %s: %s\n", what, e.what());
  std::abort();
}

const std::string& scratch() {
  static const std::string& dir = [] {
    fs::path base;
    if (const char* env = std::getenv("AXENGINE_FUZZ_TMP"); env && *env) base = env;
    else if (fs::is_directory("/dev/shm")) base = "/dev/shm";
    else base = fs::temp_directory_path();
    fs::path d = base / ("axengine-fuzz-" + std::to_string(::getpid()));
    std::error_code ec;
    fs::remove_all(d, ec);
    fs::create_directories(d);
    scratch_path = new std::string(d.string());
    std::atexit(remove_scratch);
    return std::cref(*scratch_path);
  }();
  return dir;
}

std::string fresh_dir(const std::string& name) {
  fs::path d = fs::path(scratch()) / name;
  std::error_code ec;
  fs::remove_all(d, ec);
  fs::create_directories(d);
  return d.string();
}

void write_file(const std::string& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) {
    std::fprintf(stderr, "fuzz harness: cannot write %s\n", path.c_str());
    std::abort();
  }
}

std::vector<std::string_view> split_parts(std::string_view input, std::size_t max_parts) {
  std::vector<std::string_view> parts;
  while (parts.size() + 1 < max_parts) {
    auto at = input.find(kSeparator);
    if (at == std::string_view::npos) break;
    parts.push_back(input.substr(0, at));
    input.remove_prefix(at + kSeparator.size());
  }
  parts.push_back(input);
  return parts;
}

void quiet_logs() {
  static const bool done = [] {
    ax::log::set_level(ax::log::Level::off);
    return true;
  }();
  (void)done;
}

Registration::Registration(const char* name, Body body) { table().push_back({name, body}); }
const std::vector<Entry>& registered() { return table(); }

}  // namespace ax::fuzz
