// Parquet data files (what HF `datasets` writes: data/train-00000-of-00001.parquet), read with the libparquet
// and libarrow of the pyarrow wheel when the build found them (AXENGINE_WITH_PARQUET, core/CMakeLists.txt).
// Each row becomes a JSON object, column name -> value, so every dataset type checks a Parquet row as it
// checks a JSON one: strings, integers, floats, booleans and nulls map to their JSON kinds, lists to arrays,
// structs to objects (a `messages` column of list<struct<role, content>> reads as the JSON rows would),
// dictionary-encoded columns to their values. A column of another Arrow type (binary, dates, decimals, an HF
// Image feature's struct<bytes: binary, ...>) is left out of the rows and listed: no dataset type reads one,
// guessing a JSON form would hide that, and refusing the file would stop users whose files carry such a
// column beside the ones they train on. A row that fails its type's check names the left-out columns.
#include "data/jsonl.hpp"

#include <algorithm>

#include "axengine/error.hpp"
#include "axengine/strings.hpp"

#ifdef AXENGINE_WITH_PARQUET
#include <arrow/api.h>
#include <arrow/io/file.h>
#include <parquet/arrow/reader.h>
#include <parquet/exception.h>

#include "axengine/input_file.hpp"
#endif

namespace ax::data {

#ifndef AXENGINE_WITH_PARQUET

bool parquet_supported() { return false; }

ParquetRows read_parquet_rows(const std::string& path) {
  throw UsageError(ax::str(path, ": axengine was built without Parquet support (its build found no pyarrow with the "
                           "Arrow C++ libraries; scripts/setup.sh installs it); convert the file to JSONL, e.g. "
                           "datasets.Dataset.from_parquet(PATH).to_json(PATH.jsonl)"));
}

#else

bool parquet_supported() { return true; }

namespace {

// Nesting deeper than any dataset's rows: a crafted schema must not recurse the converter off the stack.
constexpr int kMaxDepth = 32;

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
T ok(arrow::Result<T> r, const std::string& path) {
  if (!r.ok()) throw UsageError(ax::str(path, ": not a readable Parquet file: ", r.status().ToString()));
  return std::move(r).ValueUnsafe();
}

}  // namespace

ParquetRows read_parquet_rows(const std::string& path) {
  // Opened through InputFile, so a FIFO or device named *.parquet is refused, never read; the descriptor is
  // handed to Arrow, which closes it.
  InputFile input(path, "dataset file");
  ParquetRows out;
  std::vector<nlohmann::json>& rows = out.rows;
  // The system allocator, not the wheel's bundled jemalloc/mimalloc: one allocator in a process that also
  // holds LibTorch, and one the sanitizers see.
  arrow::MemoryPool* pool = arrow::system_memory_pool();
  try {
    auto file = ok(arrow::io::ReadableFile::Open(input.release(), pool), path);
    auto reader = ok(parquet::arrow::OpenFile(file, pool), path);
    auto batches = ok(reader->GetRecordBatchReader(), path);
    while (true) {
      std::shared_ptr<arrow::RecordBatch> batch;
      if (auto st = batches->ReadNext(&batch); !st.ok())
        throw UsageError(ax::str(path, ": not a readable Parquet file: ", st.ToString()));
      if (!batch) break;
      if (auto st = batch->ValidateFull(); !st.ok())  // offsets in range, strings UTF-8: what the converter relies on
        throw UsageError(ax::str(path, ": not a readable Parquet file: ", st.ToString()));
      const std::size_t first = rows.size();
      rows.resize(first + static_cast<std::size_t>(batch->num_rows()), nlohmann::json::object());
      for (int c = 0; c < batch->num_columns(); ++c) {
        const std::string& name = batch->schema()->field(c)->name();
        const arrow::Array& column = *batch->column(c);
        if (!convertible(*column.type())) {
          const std::string note = ax::str("'", name, "' (", column.type()->ToString(), ")");
          if (std::find(out.unread.begin(), out.unread.end(), note) == out.unread.end()) out.unread.push_back(note);
          continue;
        }
        for (int64_t r = 0; r < batch->num_rows(); ++r) {
          try {
            rows[first + r][name] = cell(column, r, name, 0);
          } catch (const UsageError& e) {
            throw UsageError(ax::str(path, ": row ", first + r, ": ", e.what()));
          }
        }
      }
    }
  } catch (const UsageError&) {
    throw;
  } catch (const std::exception& e) {  // parquet::ParquetException and the like, from a damaged file
    throw UsageError(ax::str(path, ": not a readable Parquet file: ", e.what()));
  }
  return out;
}

#endif

}  // namespace ax::data
