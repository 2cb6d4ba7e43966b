#include "topology.h"

#include <dirent.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>

namespace mkernel::daemon {

namespace fs = std::filesystem;

namespace {

// Number of leading path components two resolved paths share.
size_t common_components(const std::string& a, const std::string& b) {
  const fs::path pa(a), pb(b);
  size_t n = 0;
  auto ia = pa.begin(), ib = pb.begin();
  for (; ia != pa.end() && ib != pb.end() && *ia == *ib; ++ia, ++ib) ++n;
  return n;
}

std::string resolve(const fs::path& p) {
  std::error_code ec;
  const fs::path r = fs::canonical(p, ec);
  return ec ? std::string() : r.string();
}

}  // namespace

std::vector<std::string> list_nvidia_gpus() {
  std::vector<std::string> out;
  DIR* d = ::opendir("/proc/driver/nvidia/gpus");
  if (d == nullptr) return out;
  while (dirent* e = ::readdir(d))
    if (e->d_name[0] != '.') out.emplace_back(e->d_name);
  ::closedir(d);
  std::sort(out.begin(), out.end());  // PCI bus order, as nvidia-smi numbers them
  return out;
}

uint32_t count_nvidia_gpus() { return static_cast<uint32_t>(list_nvidia_gpus().size()); }

std::vector<uint32_t> parse_cpu_list(const std::string& text) {
  std::vector<uint32_t> cpus;
  size_t i = 0;
  while (i < text.size()) {
    size_t j = text.find(',', i);
    if (j == std::string::npos) j = text.size();
    const std::string part = text.substr(i, j - i);
    const size_t dash = part.find('-');
    try {
      const unsigned long lo = std::stoul(part.substr(0, dash));
      const unsigned long hi = dash == std::string::npos ? lo : std::stoul(part.substr(dash + 1));
      for (unsigned long c = lo; c <= hi && c < 65536; ++c) cpus.push_back(static_cast<uint32_t>(c));
    } catch (const std::exception&) {
      return {};
    }
    i = j + 1;
  }
  return cpus;
}

std::vector<uint32_t> cpus_near_pci_device(const std::string& pci_address) {
  std::string text;
  if (FILE* f = std::fopen(("/sys/bus/pci/devices/" + pci_address + "/local_cpulist").c_str(), "r")) {
    char buf[1024] = {};
    if (std::fgets(buf, sizeof(buf), f)) text = buf;
    std::fclose(f);
  }
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return parse_cpu_list(text);
}

Topology::Topology(std::string sysfs_root) : root_(std::move(sysfs_root)) {}

std::string Topology::pci_path(const std::string& pci_address) const {
  return resolve(fs::path(root_) / "bus/pci/devices" / pci_address);
}

int Topology::numa_node_of(const std::string& pci_dir) const {
  std::ifstream f(fs::path(pci_dir) / "numa_node");
  int node = -1;
  if (f >> node) return node;
  return -1;
}

std::vector<NicInfo> Topology::nics() const {
  std::vector<NicInfo> out;
  auto scan = [&](const char* cls, bool rdma) {
    std::error_code ec;
    for (auto it = fs::directory_iterator(fs::path(root_) / "class" / cls, ec);
         !ec && it != fs::directory_iterator(); it.increment(ec)) {
      const std::string dev = resolve(it->path() / "device");
      if (dev.empty()) continue;  // virtual interface (lo, bridges, veth): no PCI device
      NicInfo n;
      n.name = it->path().filename().string();
      n.pci_path = dev;
      n.numa_node = numa_node_of(dev);
      n.rdma = rdma;
      out.push_back(std::move(n));
    }
  };
  scan("infiniband", true);
  if (out.empty()) scan("net", false);
  std::sort(out.begin(), out.end(), [](const NicInfo& a, const NicInfo& b) { return a.name < b.name; });
  return out;
}

std::vector<GpuNic> Topology::nearest_nics(const std::vector<std::string>& gpus) const {
  const std::vector<NicInfo> all = nics();
  std::vector<GpuNic> out;
  for (const std::string& gpu : gpus) {
    GpuNic g;
    g.gpu_pci = gpu;
    const std::string gpath = pci_path(gpu);
    const int gnode = gpath.empty() ? -1 : numa_node_of(gpath);
    const NicInfo* best = nullptr;
    size_t best_shared = 0;
    for (const NicInfo& n : all) {
      const size_t shared = gpath.empty() ? 0 : common_components(gpath, n.pci_path);
      const bool better =
          best == nullptr || shared > best_shared ||
          (shared == best_shared && n.numa_node == gnode && best->numa_node != gnode);
      if (better) {
        best = &n;
        best_shared = shared;
      }
    }
    if (best == nullptr) {
      g.reason = "no NIC found";
    } else {
      g.nic = best->name;
      // A root-complex path is /sys/devices/pciDDDD:BB (4 components); sharing more means a
      // bridge or switch below the root port in common.
      const size_t root_depth = common_components(fs::path(root_).string(), gpath) + 2;
      if (gpath.empty()) g.reason = "GPU not in the PCI tree; first NIC";
      else if (best_shared > root_depth + 1) g.reason = "same PCIe switch";
      else if (gnode >= 0 && best->numa_node == gnode) g.reason = "same NUMA node";
      else g.reason = "other NUMA node";
    }
    out.push_back(std::move(g));
  }
  return out;
}

}  // namespace mkernel::daemon
