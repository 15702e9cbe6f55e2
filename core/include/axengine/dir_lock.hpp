// One writer per directory: an advisory lock (flock(2)) on a lock file, held for the life of a DirLock. `run`
// holds <output_dir>/.axengine.lock, `prepare` <cache_dir>/.axengine.lock, `merge-lora` a lock beside its
// output (<parent>/.<name>.lock, the output being renamed into place whole). The file holds the holder's pid
// and host, for the message a second process gets; the kernel drops the lock when its holder dies, however it
// dies, so a lock left by a dead process is taken over (and said so). docs/training.md, "One writer per run"
// (NFS caveats there).
#pragma once
#include <string>

namespace ax {

class DirLock {
 public:
  // Locks `lock_file`, creating it (and its directory). Another live holder: UsageError "<what> is in use by pid
  // N (host H)". `what` names the directory as the user gave it, e.g. "run.output_dir runs/a".
  DirLock(const std::string& lock_file, const std::string& what);
  ~DirLock();  // removes the lock file, then releases the lock
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;

  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
};

// The lock file's name inside a locked directory.
inline constexpr const char* kDirLockFile = ".axengine.lock";

// The lock file for a directory that is written elsewhere and renamed into place whole (merge-lora's output):
// <parent>/.<name>.lock.
std::string lock_file_beside(const std::string& dir);

}  // namespace ax
