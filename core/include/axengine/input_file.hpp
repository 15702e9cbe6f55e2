// Opening the files a user names — model checkpoints and their index, config.json, tokenizer.json, dataset
// files, the run config, plugin candidates — so that a FIFO, directory or device named like one is refused
// with "PATH: not a regular file (a FIFO)" instead of hanging: open(2) of a FIFO waits for a writer, and
// reading a device may never end.
#pragma once
#include <cstdint>
#include <istream>
#include <memory>
#include <string>

namespace ax {

// A read-only descriptor of a regular file, closed on destruction.
//
// The path is stat()ed first, so a FIFO or device is refused without being opened at all (opening one can
// block or have side effects); then it is opened with O_NONBLOCK, so a file swapped for a FIFO between the
// two calls cannot block either, and the descriptor is fstat()ed, so what was checked is what is read.
// `what` names the file's role for messages ("dataset file"); it may be empty.
// Throws UsageError naming the path: "PATH: cannot open dataset file: No such file or directory",
// "PATH: not a regular file (a FIFO); expected a dataset file".
class InputFile {
 public:
  explicit InputFile(const std::string& path, const std::string& what = "");
  ~InputFile();
  InputFile(InputFile&& other) noexcept;
  InputFile& operator=(InputFile&&) = delete;
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  const std::string& path() const { return path_; }
  int fd() const { return fd_; }
  std::uint64_t size() const { return size_; }  // at open time
  // Hands the descriptor over; the caller closes it.
  int release();

  // Exactly `len` bytes at `offset` (the caller has checked the range against size()); throws
  // RuntimeError naming the path on a read error or a file that shrank.
  std::string read(std::uint64_t offset, std::uint64_t len) const;
  std::string read_all() const { return read(0, size_); }

 private:
  std::string path_;
  int fd_ = -1;
  std::uint64_t size_ = 0;
};

// The whole file (JSON and TOML inputs).
std::string read_regular_file(const std::string& path, const std::string& what = "");

// A stream over the file, for reading large inputs line by line (datasets).
std::unique_ptr<std::istream> open_regular_stream(const std::string& path, const std::string& what = "");

}  // namespace ax
