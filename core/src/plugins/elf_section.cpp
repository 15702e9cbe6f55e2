// Reads one named section of an ELF64 shared object with every offset bounds-checked: the loader uses it
// on arbitrary files (garbage, truncated, hostile) before deciding whether to load them.
#include <elf.h>

#include <cstring>

#include "axengine/descriptor.hpp"
#include "axengine/error.hpp"
#include "axengine/plugin.hpp"
#include "axengine/strings.hpp"
#include "input_file.hpp"

namespace ax {
namespace {

constexpr std::uint64_t kMaxPluginFile = std::uint64_t(4) << 30;    // refuse absurd sizes before reading
constexpr std::uint64_t kMaxDescriptor = std::uint64_t(1) << 20;

// Random access by pread: CUDA plugins can be hundreds of MB, and only the headers and two small sections
// are needed.
struct Elf {
  InputFile file;
  std::uint64_t size;

  [[noreturn]] void bad(const std::string& what) const { throw RuntimeError(str(file.path(), ": ", what)); }

  // True when [off, off + len) lies inside the file (overflow-safe).
  bool has(std::uint64_t off, std::uint64_t len) const { return off <= size && len <= size - off; }

  std::string bytes(std::uint64_t off, std::uint64_t len, const char* what) const {
    if (!has(off, len)) bad(str("not a valid ELF file (", what, " lies outside the file; truncated?)"));
    return file.read(off, len);
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
  InputFile file(path, "plugin");
  const std::uint64_t size = file.size();
  Elf f{std::move(file), size};
  if (f.size > kMaxPluginFile) f.bad("larger than any plugin should be");

  std::string ident = f.size >= EI_NIDENT ? f.bytes(0, EI_NIDENT, "ELF ident") : std::string();
  if (ident.size() < EI_NIDENT || std::memcmp(ident.data(), ELFMAG, SELFMAG) != 0) f.bad("not an ELF file");
  if (ident[EI_CLASS] != ELFCLASS64 || ident[EI_DATA] != ELFDATA2LSB) f.bad("not a 64-bit little-endian ELF file");
  auto eh = f.read<Elf64_Ehdr>(0, "ELF header");
  if (eh.e_type != ET_DYN) f.bad("not a shared object");
  if (eh.e_shentsize != sizeof(Elf64_Shdr) || eh.e_shnum == 0 || eh.e_shstrndx >= eh.e_shnum)
    f.bad("ELF section table is missing or malformed");
  if (!f.has(eh.e_shoff, std::uint64_t(eh.e_shnum) * sizeof(Elf64_Shdr)))
    f.bad("ELF section table lies outside the file (truncated?)");

  auto section = [&](unsigned i) { return f.read<Elf64_Shdr>(eh.e_shoff + std::uint64_t(i) * sizeof(Elf64_Shdr), "section header"); };
  Elf64_Shdr names = section(eh.e_shstrndx);
  if (names.sh_size > kMaxDescriptor) f.bad("ELF section names table is implausibly large");
  const std::string name_table = f.bytes(names.sh_offset, names.sh_size, "section names");

  const std::string wanted = AXENGINE_DESCRIPTOR_SECTION;
  for (unsigned i = 0; i < eh.e_shnum; ++i) {
    Elf64_Shdr sh = section(i);
    if (sh.sh_name >= name_table.size()) continue;
    if (std::string_view(name_table.c_str() + sh.sh_name) != wanted) continue;  // c_str() ends with '\0'
    if (sh.sh_type == SHT_NOBITS) f.bad(str("section ", wanted, " holds no data"));
    if (sh.sh_size > kMaxDescriptor) f.bad(str("section ", wanted, " is too large"));
    std::string text = f.bytes(sh.sh_offset, sh.sh_size, "the descriptor section");
    return text.substr(0, text.find('\0'));
  }
  return std::nullopt;
}

}  // namespace ax
