// File: storage/checkpoint/undeletable_for_test.h
//
// Test only: makes one file of a checkpoint step undeletable, so that tests can exercise
// deletions that fail (issue 42 defect 4). Tests may run as root, where permissions do not stop
// an unlink, so the file gets the immutable attribute (chattr +i, FS_IOC_SETFLAGS), which stops
// root too, where the file system supports it and the process may set it (CAP_LINUX_IMMUTABLE;
// ext4, xfs, btrfs: yes; tmpfs, overlayfs: no). Elsewhere it falls back to the deletion code's
// seam (TEST_SetRemoveFunction in consolidate.h) failing that file's removal with EPERM. Either
// way deletions see remove(3) fail with EPERM on that file; real() says which mechanism is in
// use. The attribute is held through an open descriptor, so it is cleared again (Release or the
// destructor) even after the step directory was moved aside for deletion.
// Not thread-safe; one instance at a time per process when the fallback is in use.
#ifndef LOOM_STORAGE_CHECKPOINT_UNDELETABLE_FOR_TEST_H_
#define LOOM_STORAGE_CHECKPOINT_UNDELETABLE_FOR_TEST_H_

#include <fcntl.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "storage/checkpoint/consolidate.h"

namespace loom::storage::checkpoint_test {

class Undeletable {
 public:
  // `step_dir_name` (e.g. "step_00000100") and `file_name` (e.g. "rank_0.shard") name the file
  // inside `checkpoint_dir`; the fallback matches any path that contains the step directory's
  // name and ends with "/<file_name>", so it follows the step when it is moved aside.
  Undeletable(const std::string& checkpoint_dir, const std::string& step_dir_name,
              const std::string& file_name) {
    const std::string path = checkpoint_dir + "/" + step_dir_name + "/" + file_name;
    fd_ = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    real_ = fd_ >= 0 && SetImmutable(true);
    if (!real_) {
      StepPattern() = step_dir_name;
      FilePattern() = "/" + file_name;
      TEST_SetRemoveFunction(&FailBlocked);
    }
  }
  ~Undeletable() { Release(); }
  Undeletable(const Undeletable&) = delete;
  Undeletable& operator=(const Undeletable&) = delete;

  // True: the immutable attribute; false: the seam.
  bool real() const { return real_; }

  // Makes the file deletable again (idempotent).
  void Release() {
    if (released_) return;
    released_ = true;
    if (real_) {
      SetImmutable(false);
    } else {
      TEST_SetRemoveFunction(nullptr);
    }
    if (fd_ >= 0) ::close(fd_);
  }

 private:
  bool SetImmutable(bool on) {
    int flags = 0;
    if (::ioctl(fd_, FS_IOC_GETFLAGS, &flags) != 0) return false;
    flags = on ? (flags | FS_IMMUTABLE_FL) : (flags & ~FS_IMMUTABLE_FL);
    return ::ioctl(fd_, FS_IOC_SETFLAGS, &flags) == 0;
  }
  static std::string& StepPattern() {
    static std::string* p = new std::string;
    return *p;
  }
  static std::string& FilePattern() {
    static std::string* p = new std::string;
    return *p;
  }
  static int FailBlocked(const char* path) {
    const std::string p = path;
    const std::string& file = FilePattern();
    if (p.find(StepPattern()) != std::string::npos && p.size() >= file.size() &&
        p.compare(p.size() - file.size(), file.size(), file) == 0) {
      errno = EPERM;
      return -1;
    }
    return ::remove(path);
  }

  int fd_ = -1;
  bool real_ = false;
  bool released_ = false;
};

}  // namespace loom::storage::checkpoint_test

#endif  // LOOM_STORAGE_CHECKPOINT_UNDELETABLE_FOR_TEST_H_
