// Reads one named section of an ELF64 shared object with every offset bounds-checked, and checks what the
// dynamic loader trusts before it maps the file: the loader uses it on arbitrary files (garbage, truncated,
// hostile) before deciding whether to dlopen them.
//
// glibc's dlopen checks little of the program headers: a load segment whose file offset lies past the end
// of the file is mapped anyway and the first touch of it is a SIGBUS; overlapping load segments map one over
// another's code; a PT_DYNAMIC outside every load segment is read from unmapped memory. Any of these would
// take the whole process down, so they are refused here with a message instead. What a file that is
// well-formed at this level can still do (bad relocations, bad code) is beyond a header check; the aim is
// the damage that tools and disks produce by mistake (objcopy, truncation, bit flips).
#include <elf.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "axengine/descriptor.hpp"
#include "axengine/error.hpp"
#include "axengine/input_file.hpp"
#include "axengine/plugin.hpp"
#include "axengine/strings.hpp"

namespace ax {
namespace {

constexpr std::uint64_t kMaxPluginFile = std::uint64_t(4) << 30;    // refuse absurd sizes before reading
constexpr std::uint64_t kMaxDescriptor = std::uint64_t(1) << 20;
constexpr std::uint64_t kMaxImage = std::uint64_t(64) << 30;        // address space the load segments span
constexpr std::uint64_t kMaxAlign = std::uint64_t(1) << 30;         // linkers use 4 KiB .. 2 MiB
constexpr unsigned kMaxProgramHeaders = 4096;

#if defined(__x86_64__)
constexpr unsigned kHostMachine = EM_X86_64;
#elif defined(__aarch64__)
constexpr unsigned kHostMachine = EM_AARCH64;
#else
#error "axengine plugins: add this architecture's ELF e_machine here"
#endif

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

std::string hex(std::uint64_t v) { return str("0x", std::hex, v); }

bool power_of_two(std::uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

std::string segment_name(std::uint32_t type) {
  switch (type) {
    case PT_LOAD: return "PT_LOAD";
    case PT_DYNAMIC: return "PT_DYNAMIC";
    case PT_INTERP: return "PT_INTERP";
    case PT_NOTE: return "PT_NOTE";
    case PT_PHDR: return "PT_PHDR";
    case PT_TLS: return "PT_TLS";
    case PT_GNU_EH_FRAME: return "PT_GNU_EH_FRAME";
    case PT_GNU_STACK: return "PT_GNU_STACK";
    case PT_GNU_RELRO: return "PT_GNU_RELRO";
    case PT_GNU_PROPERTY: return "PT_GNU_PROPERTY";
    default: return str("type ", hex(type));
  }
}

void check_header(const Elf& f, const Elf64_Ehdr& eh) {
  if (eh.e_ident[EI_VERSION] != EV_CURRENT || eh.e_version != EV_CURRENT) f.bad("unknown ELF version");
  if (eh.e_ident[EI_OSABI] != ELFOSABI_SYSV && eh.e_ident[EI_OSABI] != ELFOSABI_GNU)
    f.bad(str("ELF OS ABI ", int(eh.e_ident[EI_OSABI]), " is not Linux's"));
  if (eh.e_type != ET_DYN) f.bad("not a shared object");
  if (eh.e_machine != kHostMachine) f.bad(str("built for another machine (ELF e_machine ", eh.e_machine, ", host ", kHostMachine, ")"));
  if (eh.e_ehsize != sizeof(Elf64_Ehdr)) f.bad(str("ELF header size ", eh.e_ehsize, " is not ", sizeof(Elf64_Ehdr)));
}

// The program headers, checked the way the dynamic loader will use them: every range inside the file,
// load segments sorted and disjoint, the segments the loader reads from memory inside a load segment.
void check_segments(const Elf& f, const Elf64_Ehdr& eh) {
  if (eh.e_phentsize != sizeof(Elf64_Phdr))
    f.bad(str("ELF program header size ", eh.e_phentsize, " is not ", sizeof(Elf64_Phdr)));
  if (eh.e_phnum == 0 || eh.e_phnum > kMaxProgramHeaders)
    f.bad(str("ELF program header count ", eh.e_phnum, " is implausible"));
  if (!f.has(eh.e_phoff, std::uint64_t(eh.e_phnum) * sizeof(Elf64_Phdr)))
    f.bad(str("ELF program header table (offset ", hex(eh.e_phoff), ", ", eh.e_phnum,
              " entries) lies outside the file (", f.size, " bytes)"));
  std::vector<Elf64_Phdr> ph(eh.e_phnum);
  std::string table = f.bytes(eh.e_phoff, ph.size() * sizeof(Elf64_Phdr), "program header table");
  std::memcpy(ph.data(), table.data(), table.size());

  const std::uint64_t page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  std::vector<std::size_t> loads;
  for (std::size_t i = 0; i < ph.size(); ++i) {
    const Elf64_Phdr& p = ph[i];
    auto bad = [&](const std::string& what) { f.bad(str("program header ", i, " (", segment_name(p.p_type), "): ", what)); };
    if (p.p_filesz > 0 && !f.has(p.p_offset, p.p_filesz))
      bad(str("file range [", hex(p.p_offset), ", +", hex(p.p_filesz), ") lies outside the file (", f.size,
              " bytes; truncated?)"));
    if (p.p_vaddr + p.p_memsz < p.p_vaddr) bad("address range wraps around");
    if (p.p_align > 1 && !power_of_two(p.p_align)) bad(str("alignment ", hex(p.p_align), " is not a power of two"));
    if ((p.p_type == PT_LOAD || p.p_type == PT_DYNAMIC || p.p_type == PT_TLS) && p.p_filesz > p.p_memsz)
      bad(str("file size ", hex(p.p_filesz), " exceeds memory size ", hex(p.p_memsz)));
    if (p.p_type != PT_LOAD) continue;
    if (p.p_align < page || p.p_align > kMaxAlign)
      bad(str("alignment ", hex(p.p_align), " is not between the page size ", hex(page), " and ", hex(kMaxAlign)));
    if ((p.p_vaddr - p.p_offset) % p.p_align != 0)
      bad(str("address ", hex(p.p_vaddr), " and file offset ", hex(p.p_offset), " disagree modulo the alignment ",
              hex(p.p_align)));
    if (!loads.empty()) {
      const Elf64_Phdr& prev = ph[loads.back()];
      if (p.p_vaddr < prev.p_vaddr)
        bad(str("load segments are not sorted by address (", hex(p.p_vaddr), " follows program header ", loads.back(),
                " at ", hex(prev.p_vaddr), ")"));
      if (p.p_vaddr < prev.p_vaddr + prev.p_memsz)
        bad(str("overlaps the load segment of program header ", loads.back(), " ([", hex(prev.p_vaddr), ", ",
                hex(prev.p_vaddr + prev.p_memsz), ") and [", hex(p.p_vaddr), ", ", hex(p.p_vaddr + p.p_memsz), "))"));
    }
    loads.push_back(i);
  }
  if (loads.empty()) f.bad("no loadable segment (PT_LOAD)");
  const std::uint64_t image_begin = ph[loads.front()].p_vaddr;
  const std::uint64_t image_end = ph[loads.back()].p_vaddr + ph[loads.back()].p_memsz;
  if (image_end - image_begin > kMaxImage)
    f.bad(str("load segments span ", hex(image_end - image_begin), " bytes of address space, more than any plugin needs"));

  // The load segment holding [vaddr, vaddr + len) in memory; with `file_backed`, in its file-backed part at
  // the matching file offset (so the bytes the loader reads there are the file's).
  auto holder = [&](std::uint64_t vaddr, std::uint64_t len, bool file_backed, std::uint64_t offset) -> bool {
    for (std::size_t l : loads) {
      const Elf64_Phdr& L = ph[l];
      const std::uint64_t end = L.p_vaddr + (file_backed ? L.p_filesz : L.p_memsz);
      if (vaddr < L.p_vaddr || vaddr > end || len > end - vaddr) continue;
      return !file_backed || offset - L.p_offset == vaddr - L.p_vaddr;
    }
    return false;
  };
  int dynamic = 0, tls = 0;
  for (std::size_t i = 0; i < ph.size(); ++i) {
    const Elf64_Phdr& p = ph[i];
    auto bad = [&](const std::string& what) { f.bad(str("program header ", i, " (", segment_name(p.p_type), "): ", what)); };
    auto range = [&](std::uint64_t len) { return str("[", hex(p.p_vaddr), ", ", hex(p.p_vaddr + len), ")"); };
    switch (p.p_type) {
      case PT_DYNAMIC:  // read by the loader from memory: its bytes must be the file's
        ++dynamic;
        if (p.p_filesz == 0 || p.p_filesz % sizeof(Elf64_Dyn) != 0) bad(str("size ", hex(p.p_filesz), " is not a whole number of entries"));
        if (!holder(p.p_vaddr, p.p_filesz, true, p.p_offset)) bad(str(range(p.p_filesz), " is not inside a load segment's file contents"));
        break;
      case PT_TLS:  // its initialisation image is copied from memory for every thread
        ++tls;
        if (!holder(p.p_vaddr, p.p_filesz, true, p.p_offset)) bad(str(range(p.p_filesz), " is not inside a load segment's file contents"));
        break;
      case PT_PHDR: case PT_INTERP: case PT_NOTE: case PT_GNU_PROPERTY: case PT_GNU_EH_FRAME:
        // read from memory by the loader or the unwinder
        if (p.p_memsz > 0 && !holder(p.p_vaddr, p.p_memsz, false, 0)) bad(str(range(p.p_memsz), " is not inside a load segment"));
        break;
      case PT_GNU_RELRO:  // made read-only after relocation: must not reach beyond the library's own mappings
        if (p.p_vaddr < image_begin || p.p_vaddr + p.p_memsz > image_end)
          bad(str(range(p.p_memsz), " reaches outside the load segments [", hex(image_begin), ", ", hex(image_end), ")"));
        break;
      default: break;
    }
  }
  if (dynamic != 1) f.bad(str(dynamic, " dynamic segments (PT_DYNAMIC); a shared object has one"));
  if (tls > 1) f.bad(str(tls, " TLS segments (PT_TLS); at most one is allowed"));
}

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
  check_header(f, eh);
  check_segments(f, eh);

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
