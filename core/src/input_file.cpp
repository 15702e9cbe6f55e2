#include "axengine/input_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ext/stdio_filebuf.h>

#include "axengine/error.hpp"
#include "axengine/strings.hpp"

namespace ax {
namespace {

const char* kind_of(mode_t mode) {
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "of an unknown kind";
}

UsageError not_regular(const std::string& path, const std::string& what, mode_t mode) {
  const bool vowel = !what.empty() && std::strchr("aeiou", what[0]) != nullptr;
  return UsageError(str(path, ": not a regular file (", kind_of(mode), ")", what.empty() ? "" : vowel ? "; expected an " : "; expected a ", what));
}

UsageError cannot_open(const std::string& path, const std::string& what, int err) {
  return UsageError(str(path, ": cannot open", what.empty() ? "" : " ", what, ": ", std::strerror(err)));
}

// libstdc++'s filebuf over a descriptor (it closes the descriptor when destroyed): std::ifstream can only
// open by name, which is what must not happen for a path that may be a FIFO.
struct DescriptorStream : std::istream {
  __gnu_cxx::stdio_filebuf<char> buf;
  explicit DescriptorStream(int fd) : std::istream(nullptr), buf(fd, std::ios::in | std::ios::binary, 1 << 16) {
    rdbuf(&buf);
  }
};

}  // namespace

InputFile::InputFile(const std::string& path, const std::string& what) : path_(path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) throw cannot_open(path, what, errno);
  if (!S_ISREG(st.st_mode)) throw not_regular(path, what, st.st_mode);
  fd_ = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd_ < 0) throw cannot_open(path, what, errno);
  if (::fstat(fd_, &st) != 0) {
    const int err = errno;
    ::close(fd_);
    throw cannot_open(path, what, err);
  }
  if (!S_ISREG(st.st_mode)) {  // swapped between stat and open
    ::close(fd_);
    throw not_regular(path, what, st.st_mode);
  }
  // Regular files ignore O_NONBLOCK; dropping it keeps later readers from ever seeing EAGAIN.
  ::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) & ~O_NONBLOCK);
  size_ = static_cast<std::uint64_t>(st.st_size);
}

InputFile::~InputFile() {
  if (fd_ >= 0) ::close(fd_);
}

InputFile::InputFile(InputFile&& other) noexcept : path_(std::move(other.path_)), fd_(other.fd_), size_(other.size_) {
  other.fd_ = -1;
}

int InputFile::release() {
  int fd = fd_;
  fd_ = -1;
  return fd;
}

std::string InputFile::read(std::uint64_t offset, std::uint64_t len) const {
  std::string out(len, '\0');
  std::uint64_t done = 0;
  while (done < len) {
    ssize_t n = ::pread(fd_, out.data() + done, len - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw RuntimeError(str(path_, ": read failed: ", std::strerror(errno)));
    if (n == 0) throw RuntimeError(str(path_, ": read failed: the file shrank while being read"));
    done += static_cast<std::uint64_t>(n);
  }
  return out;
}

std::string read_regular_file(const std::string& path, const std::string& what) {
  return InputFile(path, what).read_all();
}

std::unique_ptr<std::istream> open_regular_stream(const std::string& path, const std::string& what) {
  InputFile f(path, what);
  return std::make_unique<DescriptorStream>(f.release());
}

}  // namespace ax
