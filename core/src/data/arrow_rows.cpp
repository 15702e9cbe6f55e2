// Parquet and Arrow IPC files as rows (data/arrow_rows.hpp). Each row becomes a JSON object, column name ->
// value, so every dataset type checks an Arrow row as it checks a JSON one: strings, integers, floats, booleans
// and nulls map to their JSON kinds, lists to arrays, structs to objects (a `messages` column of
// list<struct<role, content>> reads as the JSON rows would), dictionary-encoded columns to their values, and
// HF datasets' Json feature (the arrow.json extension: JSON text) to the value the text holds, as datasets
// decodes it. A column of another Arrow type (binary, dates, decimals, an HF Image feature's
// struct<bytes: binary, ...>) is left out of the rows and listed: no dataset type reads one, guessing a JSON
// form would hide that, and refusing the file would stop users whose files carry such a column beside the
// ones they train on. A row that fails its type's check names the left-out columns.
#include "data/arrow_rows.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string_view>

#include "axengine/error.hpp"
#include "axengine/input_file.hpp"
#include "axengine/strings.hpp"

#ifdef AXENGINE_WITH_PARQUET
#include <sys/mman.h>

#include <arrow/api.h>
#include <arrow/extension_type.h>
#include <arrow/io/file.h>
#include <arrow/io/memory.h>
#include <arrow/ipc/reader.h>
#include <parquet/arrow/reader.h>
#include <parquet/exception.h>
#endif

namespace ax::data {

struct ArrowTable::Impl {
  std::string path;
  int64_t rows = 0;
  std::vector<std::string> unread;
#ifdef AXENGINE_WITH_PARQUET
  std::shared_ptr<arrow::Schema> schema;
  std::vector<std::shared_ptr<arrow::RecordBatch>> batches;
  std::vector<int64_t> starts;  // the first row of each batch
  std::vector<int> columns;     // the readable ones
  std::vector<char> json;       // per column: arrow.json text, decoded
#endif
};

ArrowTable::ArrowTable(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ArrowTable::ArrowTable(ArrowTable&&) noexcept = default;
ArrowTable& ArrowTable::operator=(ArrowTable&&) noexcept = default;
ArrowTable::~ArrowTable() = default;
const std::string& ArrowTable::path() const { return impl_->path; }
int64_t ArrowTable::num_rows() const { return impl_->rows; }
const std::vector<std::string>& ArrowTable::unread() const { return impl_->unread; }

#ifndef AXENGINE_WITH_PARQUET

bool arrow_supported() { return false; }

namespace {
[[noreturn]] void unsupported(const std::string& path, const char* format) {
  throw UsageError(ax::str(path, ": axengine was built without ", format, " support (its build found no pyarrow with the "
                           "Arrow C++ libraries; scripts/setup.sh installs it); convert the data to JSONL, e.g. "
                           "datasets.load_from_disk(DIR).to_json(PATH.jsonl)"));
}
}  // namespace

ArrowTable ArrowTable::read_parquet(const std::string& path) { unsupported(path, "Parquet"); }
ArrowTable ArrowTable::read_ipc(const std::string& path) { unsupported(path, "Arrow"); }
std::vector<nlohmann::json> ArrowTable::rows(int64_t, int64_t, const std::vector<std::string>&) const { return {}; }

#else

bool arrow_supported() { return true; }

namespace {

// Nesting deeper than any dataset's rows: a crafted schema must not recurse the converter off the stack.
constexpr int kMaxDepth = 32;

bool is_json_extension(const arrow::DataType& t) {
  return t.id() == arrow::Type::EXTENSION && static_cast<const arrow::ExtensionType&>(t).extension_name() == "arrow.json";
}

// A column holding arrow.json text, as the extension type or, where the reader does not know the extension, its
// string storage with the extension's field metadata.
bool json_column(const arrow::Field& f) {
  if (is_json_extension(*f.type())) return true;
  const auto& md = f.metadata();
  if (!md) return false;
  auto name = md->Get("ARROW:extension:name");
  return name.ok() && *name == "arrow.json";
}

// Whether cell() converts every value of this type.
bool convertible(const arrow::DataType& t, int depth = 0) {
  if (depth > kMaxDepth) return false;
  switch (t.id()) {
    case arrow::Type::NA: case arrow::Type::BOOL: case arrow::Type::INT8: case arrow::Type::INT16:
    case arrow::Type::INT32: case arrow::Type::INT64: case arrow::Type::UINT8: case arrow::Type::UINT16:
    case arrow::Type::UINT32: case arrow::Type::UINT64: case arrow::Type::FLOAT: case arrow::Type::DOUBLE:
    case arrow::Type::STRING: case arrow::Type::LARGE_STRING: case arrow::Type::STRING_VIEW:
      return true;
    case arrow::Type::LIST: case arrow::Type::LARGE_LIST: case arrow::Type::FIXED_SIZE_LIST: case arrow::Type::STRUCT:
      for (const auto& f : t.fields())
        if (!convertible(*f->type(), depth + 1)) return false;
      return true;
    case arrow::Type::DICTIONARY:
      return convertible(*static_cast<const arrow::DictionaryType&>(t).value_type(), depth + 1);
    case arrow::Type::EXTENSION:
      return is_json_extension(t) && convertible(*static_cast<const arrow::ExtensionType&>(t).storage_type(), depth + 1);
    default:
      return false;
  }
}

template <class ArrowType>
nlohmann::json number(const arrow::Array& a, int64_t i) {
  return static_cast<const arrow::NumericArray<ArrowType>&>(a).Value(i);
}

template <class ListArray>
nlohmann::json list(const arrow::Array& a, int64_t i, const std::string& column, int depth);

// The value arrow.json text holds (datasets' Json feature decodes it with ujson.loads).
nlohmann::json parse_json_text(const nlohmann::json& text, const std::string& column) {
  if (!text.is_string()) return text;
  nlohmann::json v = nlohmann::json::parse(text.get_ref<const std::string&>(), nullptr, /*allow_exceptions=*/false);
  if (v.is_discarded()) throw UsageError(ax::str("column '", column, "' (Json) holds text that is not JSON"));
  return v;
}

nlohmann::json cell(const arrow::Array& a, int64_t i, const std::string& column, int depth) {
  if (depth > kMaxDepth) throw UsageError(ax::str("column '", column, "' is nested more than ", kMaxDepth, " levels deep"));
  if (a.IsNull(i)) return nullptr;
  switch (a.type_id()) {
    case arrow::Type::NA: return nullptr;
    case arrow::Type::BOOL: return static_cast<const arrow::BooleanArray&>(a).Value(i);
    case arrow::Type::INT8: return number<arrow::Int8Type>(a, i);
    case arrow::Type::INT16: return number<arrow::Int16Type>(a, i);
    case arrow::Type::INT32: return number<arrow::Int32Type>(a, i);
    case arrow::Type::INT64: return number<arrow::Int64Type>(a, i);
    case arrow::Type::UINT8: return number<arrow::UInt8Type>(a, i);
    case arrow::Type::UINT16: return number<arrow::UInt16Type>(a, i);
    case arrow::Type::UINT32: return number<arrow::UInt32Type>(a, i);
    case arrow::Type::UINT64: return number<arrow::UInt64Type>(a, i);
    case arrow::Type::FLOAT: return number<arrow::FloatType>(a, i);
    case arrow::Type::DOUBLE: return number<arrow::DoubleType>(a, i);
    case arrow::Type::STRING: return std::string(static_cast<const arrow::StringArray&>(a).GetView(i));
    case arrow::Type::LARGE_STRING: return std::string(static_cast<const arrow::LargeStringArray&>(a).GetView(i));
    case arrow::Type::STRING_VIEW: return std::string(static_cast<const arrow::StringViewArray&>(a).GetView(i));
    case arrow::Type::LIST: return list<arrow::ListArray>(a, i, column, depth);
    case arrow::Type::LARGE_LIST: return list<arrow::LargeListArray>(a, i, column, depth);
    case arrow::Type::FIXED_SIZE_LIST: return list<arrow::FixedSizeListArray>(a, i, column, depth);
    case arrow::Type::STRUCT: {
      const auto& s = static_cast<const arrow::StructArray&>(a);
      nlohmann::json obj = nlohmann::json::object();
      for (int f = 0; f < s.num_fields(); ++f) {
        const std::string& name = s.struct_type()->field(f)->name();
        obj[name] = cell(*s.field(f), i, column + "." + name, depth + 1);  // field() applies the struct's offset
      }
      return obj;
    }
    case arrow::Type::DICTIONARY: {
      const auto& d = static_cast<const arrow::DictionaryArray&>(a);
      const int64_t k = d.GetValueIndex(i);
      if (k < 0 || k >= d.dictionary()->length())
        throw UsageError(ax::str("column '", column, "': dictionary index ", k, " out of range"));
      return cell(*d.dictionary(), k, column, depth + 1);
    }
    case arrow::Type::EXTENSION:
      if (is_json_extension(*a.type()))
        return parse_json_text(cell(*static_cast<const arrow::ExtensionArray&>(a).storage(), i, column, depth + 1), column);
      [[fallthrough]];
    default:
      throw UsageError(ax::str("column '", column, "' has Arrow type ", a.type()->ToString(),
                               ", which no dataset type reads (strings, numbers, booleans, lists and structs do)"));
  }
}

template <class ListArray>
nlohmann::json list(const arrow::Array& a, int64_t i, const std::string& column, int depth) {
  const auto& l = static_cast<const ListArray&>(a);
  const int64_t begin = l.value_offset(i), n = l.value_length(i);
  const arrow::Array& values = *l.values();
  if (begin < 0 || n < 0 || begin + n > values.length())
    throw UsageError(ax::str("column '", column, "': list offsets out of range"));
  nlohmann::json out = nlohmann::json::array();
  for (int64_t k = 0; k < n; ++k) out.push_back(cell(values, begin + k, column, depth + 1));
  return out;
}

template <class T>
T ok(arrow::Result<T> r, const std::string& path, const char* format) {
  if (!r.ok()) throw UsageError(ax::str(path, ": not a readable ", format, " file: ", r.status().ToString()));
  return std::move(r).ValueUnsafe();
}

// A read-only mapping of a file, as an Arrow buffer: Arrow IPC messages are then slices of it (no copy, and a
// length field that lies reads past no end: the reader checks it against the buffer).
class MappedFile final : public arrow::Buffer {
 public:
  MappedFile(void* data, int64_t size) : arrow::Buffer(static_cast<const uint8_t*>(data), size), map_(data) {}
  ~MappedFile() override {
    if (map_) ::munmap(map_, static_cast<std::size_t>(size_));
  }

 private:
  void* map_;
};

std::shared_ptr<arrow::Buffer> map_file(const std::string& path) {
  InputFile input(path, "dataset file");  // a FIFO or device named *.arrow is refused, never read
  if (input.size() == 0) return std::make_shared<arrow::Buffer>(static_cast<const uint8_t*>(nullptr), 0);
  void* p = ::mmap(nullptr, input.size(), PROT_READ, MAP_PRIVATE, input.fd(), 0);
  if (p == MAP_FAILED) throw RuntimeError(ax::str(path, ": cannot map the file: ", std::strerror(errno)));
  return std::make_shared<MappedFile>(p, static_cast<int64_t>(input.size()));
}

// Checks each batch (offsets in range, strings UTF-8: what the converter relies on), then indexes the rows and
// the columns it reads.
void finish(ArrowTable::Impl& t, const char* format) {
  for (const auto& b : t.batches) {
    if (auto st = b->ValidateFull(); !st.ok())
      throw UsageError(ax::str(t.path, ": not a readable ", format, " file: ", st.ToString()));
    if (!b->schema()->Equals(*t.schema, /*check_metadata=*/false))
      throw UsageError(ax::str(t.path, ": not a readable ", format, " file: a record batch's schema differs from the file's"));
    t.starts.push_back(t.rows);
    t.rows += b->num_rows();
  }
  for (int c = 0; c < t.schema->num_fields(); ++c) {
    const auto& field = *t.schema->field(c);
    const bool json = json_column(field);
    if (!convertible(*field.type()) || (json && !is_json_extension(*field.type()) && field.type()->id() != arrow::Type::STRING &&
                                        field.type()->id() != arrow::Type::LARGE_STRING)) {
      const std::string note = ax::str("'", field.name(), "' (", field.type()->ToString(), ")");
      if (std::find(t.unread.begin(), t.unread.end(), note) == t.unread.end()) t.unread.push_back(note);
      continue;
    }
    t.columns.push_back(c);
    t.json.push_back(json && !is_json_extension(*field.type()));
  }
}

}  // namespace

ArrowTable ArrowTable::read_parquet(const std::string& path) {
  auto t = std::make_unique<Impl>();
  t->path = path;
  // Opened through InputFile, so a FIFO or device named *.parquet is refused, never read; the descriptor is
  // handed to Arrow, which closes it.
  InputFile input(path, "dataset file");
  // The system allocator, not the wheel's bundled jemalloc/mimalloc: one allocator in a process that also
  // holds LibTorch, and one the sanitizers see.
  arrow::MemoryPool* pool = arrow::system_memory_pool();
  try {
    auto file = ok(arrow::io::ReadableFile::Open(input.release(), pool), path, "Parquet");
    auto reader = ok(parquet::arrow::OpenFile(file, pool), path, "Parquet");
    auto batches = ok(reader->GetRecordBatchReader(), path, "Parquet");
    t->schema = batches->schema();
    while (true) {
      std::shared_ptr<arrow::RecordBatch> batch;
      if (auto st = batches->ReadNext(&batch); !st.ok())
        throw UsageError(ax::str(path, ": not a readable Parquet file: ", st.ToString()));
      if (!batch) break;
      t->batches.push_back(std::move(batch));
    }
    finish(*t, "Parquet");
  } catch (const UsageError&) {
    throw;
  } catch (const std::exception& e) {  // parquet::ParquetException and the like, from a damaged file
    throw UsageError(ax::str(path, ": not a readable Parquet file: ", e.what()));
  }
  return ArrowTable(std::move(t));
}

ArrowTable ArrowTable::read_ipc(const std::string& path) {
  auto t = std::make_unique<Impl>();
  t->path = path;
  auto options = arrow::ipc::IpcReadOptions::Defaults();
  options.memory_pool = arrow::system_memory_pool();  // as for Parquet
  options.use_threads = false;
  try {
    auto buffer = map_file(path);
    auto input = std::make_shared<arrow::io::BufferReader>(buffer);
    // The file format starts with its magic; datasets writes the stream format (no magic, messages from byte 0).
    if (buffer->size() >= 6 && std::string_view(reinterpret_cast<const char*>(buffer->data()), 6) == "ARROW1") {
      auto reader = ok(arrow::ipc::RecordBatchFileReader::Open(input, options), path, "Arrow");
      t->schema = reader->schema();
      for (int i = 0; i < reader->num_record_batches(); ++i)
        t->batches.push_back(ok(reader->ReadRecordBatch(i), path, "Arrow"));
    } else {
      auto reader = ok(arrow::ipc::RecordBatchStreamReader::Open(input, options), path, "Arrow");
      t->schema = reader->schema();
      while (true) {
        std::shared_ptr<arrow::RecordBatch> batch;
        if (auto st = reader->ReadNext(&batch); !st.ok())
          throw UsageError(ax::str(path, ": not a readable Arrow file: ", st.ToString()));
        if (!batch) break;
        t->batches.push_back(std::move(batch));
      }
    }
    finish(*t, "Arrow");
  } catch (const UsageError&) {
    throw;
  } catch (const RuntimeError&) {
    throw;
  } catch (const std::exception& e) {
    throw UsageError(ax::str(path, ": not a readable Arrow file: ", e.what()));
  }
  return ArrowTable(std::move(t));
}

std::vector<nlohmann::json> ArrowTable::rows(int64_t from, int64_t to, const std::vector<std::string>& columns) const {
  const Impl& t = *impl_;
  from = std::max<int64_t>(from, 0);
  to = std::min(to, t.rows);
  std::vector<nlohmann::json> out(static_cast<std::size_t>(std::max<int64_t>(to - from, 0)), nlohmann::json::object());
  for (std::size_t b = 0; b < t.batches.size() && from < to; ++b) {
    const arrow::RecordBatch& batch = *t.batches[b];
    const int64_t lo = std::max(from, t.starts[b]) - t.starts[b], hi = std::min(to, t.starts[b] + batch.num_rows()) - t.starts[b];
    if (lo >= hi) continue;
    for (std::size_t k = 0; k < t.columns.size(); ++k) {
      const std::string& name = t.schema->field(t.columns[k])->name();
      if (!columns.empty() && std::find(columns.begin(), columns.end(), name) == columns.end()) continue;
      const arrow::Array& column = *batch.column(t.columns[k]);
      for (int64_t r = lo; r < hi; ++r) {
        const int64_t row = t.starts[b] + r;
        try {
          nlohmann::json v = cell(column, r, name, 0);
          out[static_cast<std::size_t>(row - from)][name] = t.json[k] ? parse_json_text(v, name) : std::move(v);
        } catch (const UsageError& e) {
          throw UsageError(ax::str(t.path, ": row ", row, ": ", e.what()));
        }
      }
    }
  }
  return out;
}

#endif

}  // namespace ax::data
