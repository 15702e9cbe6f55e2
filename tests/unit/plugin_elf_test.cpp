// Plugin files with a valid descriptor but program headers the dynamic loader would trip on. Each is a copy
// of the test_ok plugin with bytes rewritten here, the way objcopy, a truncated download or a flipped bit
// leaves them. dlopen maps such a file and then faults (SIGBUS/SIGSEGV) inside the loader, taking the whole
// process down; the loader must refuse each with a message naming the file and the problem, and go on.
#include <doctest/doctest.h>
#include <elf.h>

#include <cstring>

#include "axengine/plugin_loader.hpp"
#include "axengine/registry.hpp"
#include "test_util.hpp"

using ax::PluginReport;
using namespace ax_test;

namespace {

bool contains(const std::string& hay, const std::string& needle) { return hay.find(needle) != std::string::npos; }

// The bytes of an ELF64 file with typed access to its headers.
struct ElfBytes {
  std::string bytes;

  template <class T>
  T get(std::uint64_t off) const {
    REQUIRE(off + sizeof(T) <= bytes.size());
    T v;
    std::memcpy(&v, bytes.data() + off, sizeof v);
    return v;
  }
  template <class T>
  void put(std::uint64_t off, const T& v) {
    REQUIRE(off + sizeof(T) <= bytes.size());
    std::memcpy(bytes.data() + off, &v, sizeof v);
  }
  Elf64_Ehdr header() const { return get<Elf64_Ehdr>(0); }
  std::uint64_t ph_off(std::size_t i) const { return header().e_phoff + i * sizeof(Elf64_Phdr); }
  Elf64_Phdr ph(std::size_t i) const { return get<Elf64_Phdr>(ph_off(i)); }
  void set_ph(std::size_t i, const Elf64_Phdr& p) { put(ph_off(i), p); }
  std::uint64_t sh_off(std::size_t i) const { return header().e_shoff + i * sizeof(Elf64_Shdr); }
  Elf64_Shdr sh(std::size_t i) const { return get<Elf64_Shdr>(sh_off(i)); }

  std::vector<std::size_t> segments(std::uint32_t type) const {
    std::vector<std::size_t> out;
    for (std::size_t i = 0; i < header().e_phnum; ++i)
      if (ph(i).p_type == type) out.push_back(i);
    return out;
  }
  Elf64_Shdr section(const std::string& name) const {
    const Elf64_Shdr names = sh(header().e_shstrndx);
    for (std::size_t i = 0; i < header().e_shnum; ++i)
      if (std::string(bytes.c_str() + names.sh_offset + sh(i).sh_name) == name) return sh(i);
    FAIL("no section ", name);
    return {};
  }
};

ElfBytes valid_plugin() {
  ElfBytes e{read_file(test_plugin("test_ok"))};
  REQUIRE(e.bytes.size() > 4096);
  REQUIRE(e.segments(PT_LOAD).size() >= 3);
  return e;
}

struct Corruption {
  std::string file;      // name in the plugin directory
  std::string expected;  // what the refusal must say
  std::string bytes;
};

// One corrupted copy of test_ok per way the program headers can be broken.
std::vector<Corruption> corruptions() {
  std::vector<Corruption> out;
  const ElfBytes valid = valid_plugin();
  const auto loads = valid.segments(PT_LOAD);

  {  // A load segment's file offset set to 2^40 (page aligned, so the loader's own alignment check passes).
    ElfBytes e = valid;
    std::size_t i = loads[1];
    Elf64_Phdr p = e.ph(i);
    REQUIRE(p.p_vaddr % p.p_align == 0);
    p.p_offset = std::uint64_t(1) << 40;
    e.set_ph(i, p);
    out.push_back({"a_load_offset_2_40.so", "(PT_LOAD): file range [0x10000000000, +", e.bytes});
  }
  {  // Two load segments overlapping in memory: the third mapped over the second's code.
    ElfBytes e = valid;
    Elf64_Phdr a = e.ph(loads[1]), b = e.ph(loads[2]);
    REQUIRE(a.p_memsz > b.p_align);
    b.p_vaddr = b.p_paddr = a.p_vaddr - a.p_vaddr % b.p_align + b.p_offset % b.p_align;
    e.set_ph(loads[2], b);
    out.push_back({"b_overlapping_loads.so", "overlaps the load segment of program header", e.bytes});
  }
  {  // Cut right after the descriptor section; the section table (and its names) appended again so the
     // descriptor still reads: the later load segments now lie past the end of the file.
    ElfBytes e = valid;
    const Elf64_Shdr desc = e.section("axengine_plugin");
    const std::uint64_t cut = desc.sh_offset + desc.sh_size;
    const Elf64_Phdr last = e.ph(loads.back());
    REQUIRE(last.p_offset + last.p_filesz > cut);
    const Elf64_Ehdr eh = e.header();
    Elf64_Shdr names = e.sh(eh.e_shstrndx);
    std::string table = e.bytes.substr(eh.e_shoff, std::uint64_t(eh.e_shnum) * sizeof(Elf64_Shdr));
    std::string name_bytes = e.bytes.substr(names.sh_offset, names.sh_size);
    e.bytes.resize(cut);
    names.sh_offset = e.bytes.size();
    e.bytes += name_bytes;
    e.bytes.resize((e.bytes.size() + 7) / 8 * 8, '\0');
    Elf64_Ehdr h = eh;
    h.e_shoff = e.bytes.size();
    e.bytes += table;
    e.put(0, h);
    e.put(e.sh_off(eh.e_shstrndx), names);
    out.push_back({"c_truncated_after_descriptor.so", "lies outside the file (" + std::to_string(e.bytes.size()) +
                                                          " bytes; truncated?)", e.bytes});
  }
  {  // The program header table pointed outside the file.
    ElfBytes e = valid;
    Elf64_Ehdr h = e.header();
    h.e_phoff = e.bytes.size() + 4096;
    e.put(0, h);
    out.push_back({"d_phoff_outside.so", "ELF program header table (offset 0x", e.bytes});
  }
  {  // Load segments out of address order.
    ElfBytes e = valid;
    Elf64_Phdr a = e.ph(loads[1]), b = e.ph(loads[2]);
    e.set_ph(loads[1], b);
    e.set_ph(loads[2], a);
    out.push_back({"e_unsorted_loads.so", "load segments are not sorted by address", e.bytes});
  }
  {  // More bytes from the file than the segment has memory.
    ElfBytes e = valid;
    Elf64_Phdr p = e.ph(loads[0]);
    p.p_filesz = p.p_memsz + 0x100;
    e.set_ph(loads[0], p);
    out.push_back({"f_filesz_over_memsz.so", "exceeds memory size", e.bytes});
  }
  {  // The dynamic section moved outside every load segment.
    ElfBytes e = valid;
    const auto dyn = e.segments(PT_DYNAMIC);
    REQUIRE(dyn.size() == 1);
    Elf64_Phdr p = e.ph(dyn[0]);
    const Elf64_Phdr last = e.ph(loads.back());
    p.p_vaddr = p.p_paddr = last.p_vaddr + last.p_memsz + 0x100000;
    e.set_ph(dyn[0], p);
    out.push_back({"g_dynamic_outside.so", "(PT_DYNAMIC): [0x", e.bytes});
  }
  {  // An alignment that is no power of two.
    ElfBytes e = valid;
    Elf64_Phdr p = e.ph(loads[1]);
    p.p_align = 0x1800;
    e.set_ph(loads[1], p);
    out.push_back({"h_bad_alignment.so", "alignment 0x1800 is not a power of two", e.bytes});
  }
  return out;
}

}  // namespace

TEST_CASE("loader: plugins with broken program headers are refused naming file and problem") {
  TempDir dir;
  const auto cases = corruptions();
  for (const auto& c : cases) write_file(dir / c.file, c.bytes);
  fs::copy_file(test_plugin("test_ok"), dir / "z_valid.so");

  ax::Registry registry;
  ax::PluginLoader loader(registry);
  loader.discover({dir.path.string()}, "/nonexistent");
  const auto& reports = loader.reports();
  REQUIRE(reports.size() == cases.size() + 1);
  for (std::size_t i = 0; i < cases.size(); ++i) {
    INFO(reports[i].path << ": " << reports[i].reason);
    CHECK(reports[i].status == PluginReport::Status::refused);
    CHECK(contains(reports[i].reason, "unreadable: " + (dir / cases[i].file) + ": "));
    CHECK(contains(reports[i].reason, cases[i].expected));
  }
  CHECK(reports.back().status == PluginReport::Status::loaded);
  CHECK(registry.find(ax::ProviderKind::optimizer, "", "test_sgd") != nullptr);
}

TEST_CASE("cli: plugins list survives plugins with broken program headers and lists the good ones") {
  TempDir dir;
  const auto cases = corruptions();
  for (const auto& c : cases) write_file(dir / c.file, c.bytes);
  fs::copy_file(test_plugin("test_ok"), dir / "z_valid.so");
  auto r = run("AXENGINE_PLUGIN_PATH=" + dir.path.string() + " timeout 120 " + axengine() + " plugins list");
  INFO(r.output);
  CHECK(r.exit_code == 0);  // a fault inside dlopen would be a signal (-1 here)
  for (const auto& c : cases) {
    CHECK(contains(r.output, "[refused] -  " + (dir / c.file)));
    CHECK(contains(r.output, "unreadable: " + (dir / c.file) + ": "));
    CHECK(contains(r.output, c.expected));
  }
  CHECK(contains(r.output, "[loaded] test_ok 1.2.3  " + (dir / "z_valid.so")));
  CHECK(contains(r.output, "optimizer test_sgd"));
}
