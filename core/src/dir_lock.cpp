// See axengine/dir_lock.hpp.
//
// Releasing removes the file before closing it, so that a finished run leaves nothing behind. That opens a race
// the acquire loop closes: a process that opened the file just before the holder removed it may lock the
// removed inode; it checks, once locked, that the path still names the inode it holds, and tries again if not.
#include "axengine/dir_lock.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "axengine/error.hpp"
#include "axengine/log.hpp"
#include "axengine/strings.hpp"

namespace fs = std::filesystem;

namespace ax {
namespace {

std::string read_all(int fd) {
  std::string out;
  char buf[256];
  ssize_t n;
  off_t at = 0;
  while ((n = ::pread(fd, buf, sizeof buf, at)) > 0 && out.size() < 4096) {
    out.append(buf, static_cast<std::size_t>(n));
    at += n;
  }
  return out;
}

// "pid N (host H)" from the file's "pid N\nhost H\n"; "" when it holds no pid.
std::string holder_of(const std::string& text) {
  std::string pid, host;
  std::size_t from = 0;
  while (from < text.size()) {
    std::size_t nl = text.find('\n', from);
    if (nl == std::string::npos) nl = text.size();
    const std::string line = text.substr(from, nl - from);
    if (line.rfind("pid ", 0) == 0) pid = line.substr(4);
    if (line.rfind("host ", 0) == 0) host = line.substr(5);
    from = nl + 1;
  }
  if (pid.empty()) return "";
  return str("pid ", pid, " (host ", host.empty() ? "unknown" : host, ")");
}

std::string this_host() {
  char host[256] = {};
  return ::gethostname(host, sizeof host - 1) == 0 ? std::string(host) : std::string("unknown");
}

}  // namespace

std::string lock_file_beside(const std::string& dir) {
  fs::path d = fs::absolute(dir).lexically_normal();
  if (!d.has_filename()) d = d.parent_path();
  return (d.parent_path() / ("." + d.filename().string() + ".lock")).string();
}

DirLock::DirLock(const std::string& lock_file, const std::string& what) : path_(lock_file) {
  std::error_code ec;
  const fs::path parent = fs::path(path_).parent_path();
  if (!parent.empty()) fs::create_directories(parent, ec);
  bool locked = true;
  for (int attempt = 0;; ++attempt) {
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) throw RuntimeError(str(what, ": cannot open the lock file ", path_, ": ", std::strerror(errno)));
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      if (err == EWOULDBLOCK) {
        const std::string holder = holder_of(read_all(fd_));
        ::close(fd_);
        fd_ = -1;
        throw UsageError(str(what, " is in use by ", holder.empty() ? std::string("another process (which has not written its pid yet)") : holder,
                             ": one writer at a time (lock file ", path_, ")"));
      }
      // A filesystem without locks (NFS mounted nolock, some FUSE filesystems): say so and go on unguarded.
      log::warn(str(what, ": cannot lock ", path_, " (", std::strerror(err), "): this filesystem does not support locks, so "
                    "nothing stops a second process from writing here at the same time"));
      locked = false;
      break;
    }
    struct stat held {}, named {};
    if (::fstat(fd_, &held) == 0 && ::stat(path_.c_str(), &named) == 0 && held.st_ino == named.st_ino && held.st_dev == named.st_dev)
      break;
    ::close(fd_);  // the previous holder removed the file after we opened it: lock the new one
    fd_ = -1;
    if (attempt >= 100) throw RuntimeError(str(what, ": the lock file ", path_, " keeps being replaced; giving up"));
  }
  // A holder that died left its pid: the kernel released its lock, and the file says whose it was.
  const std::string previous = locked ? holder_of(read_all(fd_)) : std::string();
  if (!previous.empty())
    log::warn(str(what, ": taking over the lock left by ", previous, ", which no longer holds it (the process ended without releasing it)"));
  const std::string mine = str("pid ", ::getpid(), "\nhost ", this_host(), "\n");
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, mine.data(), mine.size(), 0) != static_cast<ssize_t>(mine.size()))
    log::warn(str(what, ": cannot write this process's pid into ", path_, " (", std::strerror(errno), "); the lock holds all the same"));
}

DirLock::~DirLock() {
  if (fd_ < 0) return;
  ::unlink(path_.c_str());
  ::close(fd_);
}

}  // namespace ax
