// topology.h: what the node has, without the CUDA runtime: its NVIDIA GPUs (from the driver's
// /proc entries), the CPUs near a PCI device, and which NIC is nearest each GPU, from the PCI
// topology in sysfs.
//
// A device's place in the PCI tree is the resolved path of /sys/bus/pci/devices/<address>
// (/sys/devices/pci0000:16/0000:16:01.0/0000:17:00.0, ...). Two devices behind the same PCIe
// switch share a longer prefix of that path than two that meet only at the root complex. The
// nearest NIC to a GPU is the one sharing the longest prefix; ties go to the NIC on the GPU's
// NUMA node, then to the lower name. RDMA devices (/sys/class/infiniband) are preferred; without
// any, network interfaces backed by a PCI device (/sys/class/net/*/device) are used.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mkernel::daemon {

// GPUs this node has: NVIDIA's driver lists them (by PCI address) under
// /proc/driver/nvidia/gpus. Sorted in PCI bus order (as nvidia-smi numbers them); empty
// without the driver.
std::vector<std::string> list_nvidia_gpus();
uint32_t count_nvidia_gpus();
// Parses a Linux CPU list ("0-3,8,10-11"); empty on malformed text.
std::vector<uint32_t> parse_cpu_list(const std::string& text);
// The CPUs local to a PCI device (its NUMA node), from sysfs; empty when unknown.
std::vector<uint32_t> cpus_near_pci_device(const std::string& pci_address);

struct NicInfo {
  std::string name;         // "mlx5_0", "rdmap79s0", "eth0"
  std::string pci_path;     // resolved sysfs path of its PCI device
  int numa_node = -1;
  bool rdma = false;        // an RDMA device (infiniband class), not a plain netdev
};

struct GpuNic {
  std::string gpu_pci;      // PCI address of the GPU
  std::string nic;          // "" when the node has no NIC at all
  std::string reason;       // "same PCIe switch", "same NUMA node", "other NUMA node", ...
};

class Topology {
 public:
  // `sysfs_root` is "/sys" on a real machine; tests point it at a fake tree.
  explicit Topology(std::string sysfs_root = "/sys");

  std::vector<NicInfo> nics() const;
  // Nearest NIC for each GPU, in the order given.
  std::vector<GpuNic> nearest_nics(const std::vector<std::string>& gpu_pci_addresses) const;

 private:
  std::string pci_path(const std::string& pci_address) const;
  int numa_node_of(const std::string& pci_dir) const;
  std::string root_;
};

}  // namespace mkernel::daemon
