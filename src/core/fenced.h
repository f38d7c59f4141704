// The fenced test device (mixprec/device.h): its allocator and the scope that opens its memory to
// the host while a kernel runs. Internal.
#pragma once
#include "core/device_allocator.h"

namespace mixprec::detail {

// While any FencedAccess is alive (on any thread), the fenced device's memory is readable and
// writable; otherwise every byte of it is PROT_NONE and a host access faults. Nests.
class FencedAccess {
 public:
  FencedAccess();
  ~FencedAccess();
  FencedAccess(const FencedAccess&) = delete;
  FencedAccess& operator=(const FencedAccess&) = delete;
};
bool fenced_access_open();

}  // namespace mixprec::detail
