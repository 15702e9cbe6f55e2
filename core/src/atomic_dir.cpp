// See atomic_dir.hpp.
#include "atomic_dir.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "axengine/crash_point.hpp"
#include "axengine/error.hpp"
#include "axengine/strings.hpp"

namespace fs = std::filesystem;

namespace ax {

void fsync_dir(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw RuntimeError(str(path, ": cannot open directory to fsync: ", std::strerror(errno)));
  int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) throw RuntimeError(str(path, ": directory fsync failed: ", std::strerror(errno)));
}

void remove_tree(const std::string& path) {
  std::error_code ec;
  fs::remove_all(path, ec);
}

AtomicDir::AtomicDir(std::string dir, std::string writer) : dir_(std::move(dir)), writer_(std::move(writer)) {
  fs::path d = fs::absolute(dir_).lexically_normal();
  if (!d.has_filename()) d = d.parent_path();  // "out/" names "out"
  dir_ = d.string();
  fs::path parent = d.parent_path().empty() ? fs::path(".") : d.parent_path();
  tmp_ = (parent / (".tmp-" + d.filename().string())).string();
  fs::create_directories(parent);
  remove_tree(tmp_);
  fs::create_directory(tmp_);
}

AtomicDir::~AtomicDir() {
  if (!committed_) remove_tree(tmp_);
}

void AtomicDir::commit() {
  crash_point(writer_, "dir_filled");
  fsync_dir(tmp_);
  crash_point(writer_, "dir_synced");
  const fs::path parent = fs::path(tmp_).parent_path();
  std::error_code ec;
  std::string old;  // where a replaced version ends up, removed once the new one is durable
  bool exists = fs::exists(dir_, ec);
  if (exists && fs::is_directory(dir_, ec) && fs::is_empty(dir_, ec)) exists = false;  // rename() replaces it
  if (!exists) {
    if (::rename(tmp_.c_str(), dir_.c_str()) != 0)
      throw RuntimeError(str(tmp_, ": cannot rename to ", dir_, ": ", std::strerror(errno)));
  } else if (::renameat2(AT_FDCWD, tmp_.c_str(), AT_FDCWD, dir_.c_str(), RENAME_EXCHANGE) == 0) {
    old = tmp_;
  } else if (errno == EINVAL || errno == ENOSYS || errno == ENOTSUP) {
    old = (parent / (".old-" + fs::path(dir_).filename().string())).string();
    remove_tree(old);
    if (::rename(dir_.c_str(), old.c_str()) != 0) throw RuntimeError(str(dir_, ": cannot move aside: ", std::strerror(errno)));
    if (::rename(tmp_.c_str(), dir_.c_str()) != 0)
      throw RuntimeError(str(tmp_, ": cannot rename to ", dir_, ": ", std::strerror(errno)));
  } else {
    throw RuntimeError(str(tmp_, ": cannot exchange with ", dir_, ": ", std::strerror(errno)));
  }
  committed_ = true;
  crash_point(writer_, "dir_renamed");
  fsync_dir(parent.string());
  crash_point(writer_, "dir_parent_synced");
  if (!old.empty()) remove_tree(old);
}

}  // namespace ax
