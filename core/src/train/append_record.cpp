// See append_record.hpp.
#include "train/append_record.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "axengine/crash_point.hpp"
#include "axengine/strings.hpp"

namespace ax::train {

void append_record(const std::string& path, std::string_view bytes, std::string_view writer, bool truncate) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | (truncate ? O_TRUNC : 0), 0644);
  if (fd < 0) throw WriteError(str(path, ": cannot open for appending: ", std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    throw WriteError(str(path, ": cannot stat: ", std::strerror(err)));
  }
  const off_t before = st.st_size;
  const bool fault = write_fails_here(writer, "append");
  // The simulated full disk takes half the bytes, as a real one takes what fits in its last block.
  std::size_t left = fault ? bytes.size() / 2 : bytes.size();
  const char* p = bytes.data();
  int err = 0;
  while (left > 0) {
    const ssize_t w = ::write(fd, p, left);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {  // 0: nothing more fits (a short write the kernel reports as such)
      err = w < 0 ? errno : ENOSPC;
      break;
    }
    p += w;
    left -= static_cast<std::size_t>(w);
  }
  if (fault && err == 0) err = ENOSPC;
  if (err == 0 && ::close(fd) == 0) return;
  if (err == 0) {  // NFS reports a full disk at close: the record may be torn
    err = errno;
    const bool cut = ::truncate(path.c_str(), before) == 0;
    throw WriteError(str(path, ": close failed: ", std::strerror(err), cut ? "; the record was removed" : ""));
  }
  // Cut the torn record off (truncating frees space, so it works on a full disk too).
  const bool cut = ::ftruncate(fd, before) == 0;
  ::close(fd);
  throw WriteError(str(path, ": write failed after ", p - bytes.data(), " of ", bytes.size(), " bytes: ", std::strerror(err),
                       cut ? "; the partial record was removed" : "; the partial record could not be removed"));
}

}  // namespace ax::train
