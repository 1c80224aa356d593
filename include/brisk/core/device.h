// Where memory lives and kernels run. Nothing here assumes a CPU: a device is
// a kind and an index; what can be done on it is the Backend's business.
#pragma once

#include <cstdint>
#include <string>

namespace brisk::core {

enum class DeviceKind : uint8_t { cpu, cuda };

struct Device {
  DeviceKind kind = DeviceKind::cpu;
  int index = 0;
  static Device cpu() { return {DeviceKind::cpu, 0}; }
  static Device cuda(int i = 0) { return {DeviceKind::cuda, i}; }
  bool is_host() const { return kind == DeviceKind::cpu; }
  bool operator==(const Device& o) const { return kind == o.kind && index == o.index; }
  std::string str() const { return kind == DeviceKind::cpu ? "cpu" : "cuda:" + std::to_string(index); }
};

}  // namespace brisk::core
