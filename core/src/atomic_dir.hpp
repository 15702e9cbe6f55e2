// A directory that appears whole or not at all (checkpoints, merged and initialised model directories).
//
// Its files are written into a hidden sibling, <parent>/.tmp-<name>; commit() fsyncs that directory, renames it
// into place and fsyncs the parent. Whenever the process dies, <dir> is absent, its previous version, or the
// complete new one. Crash points (axengine/crash_point.hpp), after each step:
//   <writer>.dir_filled         every file written (each fsynced by write_file_atomic), the temp dir not synced
//   <writer>.dir_synced         the temp dir fsynced
//   <writer>.dir_renamed        in place, the parent not synced (a replaced version now sits in the temp dir)
//   <writer>.dir_parent_synced  durable; a replaced version not yet removed
#pragma once
#include <string>

namespace ax {

class AtomicDir {
 public:
  // Removes a temp dir left by a process that died while writing `dir`, and creates a fresh one.
  AtomicDir(std::string dir, std::string writer);
  ~AtomicDir();  // without commit() (an exception on the way): removes the temp dir
  AtomicDir(const AtomicDir&) = delete;
  AtomicDir& operator=(const AtomicDir&) = delete;

  const std::string& path() const { return tmp_; }  // where the files go
  const std::string& writer() const { return writer_; }
  // Puts the directory in place. An existing `dir` is replaced by an atomic exchange (renameat2
  // RENAME_EXCHANGE); where the filesystem lacks it, the old one is moved aside to .old-<name> first (a crash
  // between the two renames then leaves only that). An empty existing directory is simply replaced.
  void commit();

 private:
  std::string dir_, tmp_, writer_;
  bool committed_ = false;
};

// fsync of a directory (its entries durable); throws RuntimeError naming it.
void fsync_dir(const std::string& path);
// rm -rf, errors ignored (the caller checks what matters).
void remove_tree(const std::string& path);

}  // namespace ax
