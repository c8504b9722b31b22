// Storage: one block of bytes on one device, and who frees it.
// Either it owns memory from an Allocator, or it borrows memory (an mmap'd file, a caller's buffer)
// and holds a keep-alive handle that is released with it.
#pragma once

#include <cstddef>
#include <memory>

#include "microllm/core/device.h"
#include "microllm/core/memory.h"

namespace microllm {

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(size_t nbytes) = 0;
  virtual void deallocate(void* ptr, size_t nbytes) = 0;
  virtual Device device() const = 0;
  virtual const char* name() const = 0;
};

// 64-byte aligned host memory.
Allocator& cpu_allocator();
// The default allocator of a device (the caching allocator for CUDA). Throws NotSupportedError for
// CUDA in a build without it.
Allocator& allocator_for(Device device);

class Storage {
 public:
  static std::shared_ptr<Storage> allocate(size_t nbytes, Device device);
  static std::shared_ptr<Storage> allocate(size_t nbytes, Allocator& allocator);
  // Borrowed memory: `keep_alive` (may be null) is released when the storage dies.
  static std::shared_ptr<Storage> wrap(void* data, size_t nbytes, Device device, std::shared_ptr<void> keep_alive);

  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  ~Storage();

  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }
  Allocator* allocator() const { return allocator_; }  // null for borrowed memory
  bool owns_memory() const { return allocator_ != nullptr; }
  // What the memory is for (core/memory.h): the thread's category when it was allocated; borrowed memory is not
  // counted.
  MemoryCategory category() const { return category_; }

 private:
  Storage(void* data, size_t nbytes, Device device, Allocator* allocator, std::shared_ptr<void> keep_alive,
          MemoryCategory category)
      : data_(data),
        nbytes_(nbytes),
        device_(device),
        allocator_(allocator),
        keep_alive_(std::move(keep_alive)),
        category_(category) {}

  void* data_;
  size_t nbytes_;
  Device device_;
  Allocator* allocator_;
  std::shared_ptr<void> keep_alive_;
  MemoryCategory category_;
};

// When on, every new allocation is filled with 0xFF bytes (NaN for floats, -1 for integers), so an
// element an op forgot to write shows up in tests. Off by default; the test main turns it on.
void set_poison_new_allocations(bool on);
bool poison_new_allocations();

}  // namespace microllm
