// Reads one named section of an ELF64 shared object with every offset bounds-checked: the loader uses it
// on arbitrary files (garbage, truncated, hostile) before deciding whether to load them.
#include <elf.h>

#include <cstring>
#include <fstream>
#include <iterator>

#include "axengine/descriptor.hpp"
#include "axengine/error.hpp"
#include "axengine/plugin.hpp"
#include "axengine/strings.hpp"

namespace ax {
namespace {

constexpr std::size_t kMaxPluginFile = std::size_t(4) << 30;   // refuse absurd sizes before reading
constexpr std::size_t kMaxDescriptor = std::size_t(1) << 20;

// Random access into the file by seek+read: CUDA plugins can be hundreds of MB, and only the headers
// and two small sections are needed.
struct File {
  std::string path;
  mutable std::ifstream in;
  std::uint64_t size = 0;

  // True when [off, off + len) lies inside the file (overflow-safe).
  bool has(std::uint64_t off, std::uint64_t len) const { return off <= size && len <= size - off; }

  std::string bytes(std::uint64_t off, std::uint64_t len, const char* what) const {
    if (!has(off, len)) throw RuntimeError(str(path, ": not a valid ELF file (", what, " lies outside the file; truncated?)"));
    std::string out(len, '\0');
    in.clear();
    in.seekg(static_cast<std::streamoff>(off));
    if (len && !in.read(out.data(), static_cast<std::streamsize>(len))) throw RuntimeError(str(path, ": read failed"));
    return out;
  }

  template <class T>
  T read(std::uint64_t off, const char* what) const {
    std::string b = bytes(off, sizeof(T), what);
    T v;
    std::memcpy(&v, b.data(), sizeof(T));
    return v;
  }
};

}  // namespace

std::optional<std::string> read_descriptor_section(const std::string& path) {
  File f{path, std::ifstream(path, std::ios::binary)};
  if (!f.in) throw RuntimeError(str(path, ": cannot open"));
  f.in.seekg(0, std::ios::end);
  f.size = static_cast<std::uint64_t>(f.in.tellg());
  if (f.size > kMaxPluginFile) throw RuntimeError(str(path, ": larger than any plugin should be"));

  std::string ident = f.size >= EI_NIDENT ? f.bytes(0, EI_NIDENT, "ELF ident") : std::string();
  if (ident.size() < EI_NIDENT || std::memcmp(ident.data(), ELFMAG, SELFMAG) != 0)
    throw RuntimeError(str(path, ": not an ELF file"));
  if (ident[EI_CLASS] != ELFCLASS64 || ident[EI_DATA] != ELFDATA2LSB)
    throw RuntimeError(str(path, ": not a 64-bit little-endian ELF file"));
  auto eh = f.read<Elf64_Ehdr>(0, "ELF header");
  if (eh.e_type != ET_DYN) throw RuntimeError(str(path, ": not a shared object"));
  if (eh.e_shentsize != sizeof(Elf64_Shdr) || eh.e_shnum == 0 || eh.e_shstrndx >= eh.e_shnum)
    throw RuntimeError(str(path, ": ELF section table is missing or malformed"));
  if (!f.has(eh.e_shoff, std::uint64_t(eh.e_shnum) * sizeof(Elf64_Shdr)))
    throw RuntimeError(str(path, ": ELF section table lies outside the file (truncated?)"));

  auto section = [&](unsigned i) { return f.read<Elf64_Shdr>(eh.e_shoff + std::uint64_t(i) * sizeof(Elf64_Shdr), "section header"); };
  Elf64_Shdr names = section(eh.e_shstrndx);
  if (names.sh_size > kMaxDescriptor) throw RuntimeError(str(path, ": ELF section names table is implausibly large"));
  const std::string name_table = f.bytes(names.sh_offset, names.sh_size, "section names");

  const std::string wanted = AXENGINE_DESCRIPTOR_SECTION;
  for (unsigned i = 0; i < eh.e_shnum; ++i) {
    Elf64_Shdr sh = section(i);
    if (sh.sh_name >= name_table.size()) continue;
    if (std::string_view(name_table.c_str() + sh.sh_name) != wanted) continue;  // name_table ends with '\0'
    if (sh.sh_type == SHT_NOBITS) throw RuntimeError(str(path, ": section ", wanted, " holds no data"));
    if (sh.sh_size > kMaxDescriptor) throw RuntimeError(str(path, ": section ", wanted, " is too large"));
    std::string text = f.bytes(sh.sh_offset, sh.sh_size, "the descriptor section");
    return text.substr(0, text.find('\0'));
  }
  return std::nullopt;
}

}  // namespace ax
