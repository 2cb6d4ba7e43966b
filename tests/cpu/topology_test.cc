// GPU -> nearest NIC from a fake sysfs tree.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "topology.h"

namespace fs = std::filesystem;
namespace md = mkernel::daemon;

namespace {

class FakeSysfs {
 public:
  FakeSysfs() {
    char tmpl[] = "/tmp/mkernel-sysfs-XXXXXX";
    root_ = ::mkdtemp(tmpl);
  }
  ~FakeSysfs() { fs::remove_all(root_); }
  const std::string& root() const { return root_; }

  // A PCI device at devices/<chain...>/<address>, linked from bus/pci/devices/<address>.
  std::string pci(const std::vector<std::string>& chain, int numa) {
    fs::path p = fs::path(root_) / "devices";
    for (const auto& c : chain) p /= c;
    fs::create_directories(p);
    std::ofstream(p / "numa_node") << numa << "\n";
    fs::create_directories(fs::path(root_) / "bus/pci/devices");
    fs::create_symlink(p, fs::path(root_) / "bus/pci/devices" / chain.back());
    return p.string();
  }
  void nic(const std::string& cls, const std::string& name, const std::string& pci_dir) {
    const fs::path d = fs::path(root_) / "class" / cls / name;
    fs::create_directories(d);
    if (!pci_dir.empty()) fs::create_symlink(pci_dir, d / "device");
  }

 private:
  std::string root_;
};

}  // namespace

TEST(Topology, PrefersTheNicBehindTheSameSwitchThenTheSameNumaNode) {
  FakeSysfs s;
  // Root complex 16 (NUMA 0): switch 17/18 with GPU 19 and NIC 1a; root complex 80 (NUMA 1):
  // GPU 82 alone behind a root port; NIC 85 on another root port of the same complex.
  s.pci({"pci0000:16", "0000:16:01.0", "0000:17:00.0", "0000:18:00.0", "0000:19:00.0"}, 0);
  const std::string nic_a = s.pci({"pci0000:16", "0000:16:01.0", "0000:17:00.0", "0000:18:01.0", "0000:1a:00.0"}, 0);
  s.pci({"pci0000:80", "0000:80:01.0", "0000:82:00.0"}, 1);
  const std::string nic_b = s.pci({"pci0000:80", "0000:80:03.0", "0000:85:00.0"}, 1);
  const std::string nic_c = s.pci({"pci0000:40", "0000:40:01.0", "0000:41:00.0"}, 0);
  s.nic("infiniband", "mlx5_0", nic_a);
  s.nic("infiniband", "mlx5_1", nic_b);
  s.nic("infiniband", "mlx5_2", nic_c);
  s.nic("net", "eth0", nic_c);  // ignored: RDMA devices exist
  md::Topology t(s.root());
  ASSERT_EQ(t.nics().size(), 3u);
  const auto m = t.nearest_nics({"0000:19:00.0", "0000:82:00.0", "0000:99:00.0"});
  ASSERT_EQ(m.size(), 3u);
  EXPECT_EQ(m[0].nic, "mlx5_0");
  EXPECT_EQ(m[0].reason, "same PCIe switch");
  EXPECT_EQ(m[1].nic, "mlx5_1");
  EXPECT_EQ(m[1].reason, "same NUMA node");
  EXPECT_EQ(m[2].nic, "mlx5_0");
  EXPECT_EQ(m[2].reason, "GPU not in the PCI tree; first NIC");
}

TEST(Topology, FallsBackToPciNetworkInterfacesAndSkipsVirtualOnes) {
  FakeSysfs s;
  s.pci({"pci0000:00", "0000:00:02.0", "0000:03:00.0"}, 0);
  const std::string eth = s.pci({"pci0000:00", "0000:00:03.0", "0000:04:00.0"}, 0);
  s.nic("net", "eth0", eth);
  s.nic("net", "lo", "");
  s.nic("net", "veth1", "");
  md::Topology t(s.root());
  const auto nics = t.nics();
  ASSERT_EQ(nics.size(), 1u);
  EXPECT_EQ(nics[0].name, "eth0");
  EXPECT_FALSE(nics[0].rdma);
  const auto m = t.nearest_nics({"0000:03:00.0"});
  EXPECT_EQ(m[0].nic, "eth0");
}

TEST(Topology, NoNicAtAll) {
  FakeSysfs s;
  s.pci({"pci0000:00", "0000:00:02.0", "0000:03:00.0"}, 0);
  md::Topology t(s.root());
  const auto m = t.nearest_nics({"0000:03:00.0"});
  EXPECT_EQ(m[0].nic, "");
  EXPECT_EQ(m[0].reason, "no NIC found");
}
