// TensorBoard event files beside metrics.jsonl, so `tensorboard --logdir <output_dir>` shows a run's curves
// (train.tensorboard, on by default). The file is derived from metrics.jsonl: each record appended there is
// appended here as one Event, and a (re)started run writes a fresh file from the records it keeps, so the two
// never disagree.
//
// Format: TFRecord framing (uint64 length, masked CRC32C of the length, the bytes, masked CRC32C of the bytes) of
// `Event` protos (tensorboard's event.proto / summary.proto): a first Event carrying file_version "brain.Event:2",
// then one Event per record with wall_time, step and summary { value { tag, simple_value } }.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace ax::train {

struct Scalar {
  std::string tag;
  float value = 0;
};

// TFRecord's checksum: CRC32C rotated right by 15 bits plus a constant (a CRC of data holding CRCs stays useful).
uint32_t masked_crc32c(std::string_view bytes);
// One TFRecord holding `data`.
std::string tfrecord(std::string_view data);
// Serialised Event protos.
std::string event_file_version(double wall_time);
std::string event_scalars(double wall_time, int64_t step, const std::vector<Scalar>& values);

// The scalars a metrics.jsonl record shows in TensorBoard, by tag (train/loss, eval/loss, ...: the table in
// tensorboard.cpp); null and non-numeric fields are left out, as in report.html.
std::vector<Scalar> record_scalars(const nlohmann::json& record);

class TensorBoardLog {
 public:
  // Removes the event files earlier runs left in `output_dir` (events.out.tfevents.*: they may hold steps this
  // run redoes) and, when `enabled`, starts a new one holding `records` (those a resumed run keeps).
  // Write errors throw WriteError (append_record.hpp), the file left without a torn record.
  TensorBoardLog(const std::string& output_dir, const std::vector<nlohmann::json>& records, bool enabled);
  // Appends one record's Event and closes the file again: a crash loses at most the record being written, and a
  // truncated last record is what TensorBoard's reader expects of a file still being written. A write that
  // fails (a full disk) is cut back and throws WriteError.
  void append(const nlohmann::json& record);
  const std::string& path() const { return path_; }  // "" when disabled

 private:
  std::string path_;
};

}  // namespace ax::train
