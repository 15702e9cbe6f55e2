// safetensors reader/writer: round trips, and every kind of corrupt file gives an error naming the file and
// the tensor rather than a crash.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "axengine/error.hpp"
#include "axengine/safetensors.hpp"
#include "unit/test_paths.hpp"

namespace fs = std::filesystem;
namespace st = ax::safetensors;
using nlohmann::json;

namespace {

fs::path temp_dir(const std::string& name) { return ax::test::scratch_dir("st_" + name); }

// Writes a raw safetensors file: length prefix (possibly lying), header text, data bytes.
void write_raw(const fs::path& p, const std::string& header, const std::string& data, int64_t length_override = -1) {
  std::ofstream out(p, std::ios::binary);
  uint64_t n = length_override >= 0 ? static_cast<uint64_t>(length_override) : header.size();
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>((n >> (8 * i)) & 0xff));
  out << header << data;
}

std::string error_of(const fs::path& p) {
  try {
    st::File::open(p.string());
  } catch (const ax::UsageError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("safetensors: round trip of every float dtype, metadata and empty tensors") {
  auto d = temp_dir("rt");
  auto f32 = at::randn({3, 5});
  auto bf = at::randn({7}).to(at::kBFloat16);
  auto h = at::randn({2, 2, 2}).to(at::kHalf);
  auto i64 = at::arange(6, at::kLong).view({2, 3});
  auto empty = at::empty({0, 4});
  auto noncontig = at::randn({4, 6}).t();
  st::save((d / "a.safetensors").string(),
           {{"w.f32", f32}, {"w.bf16", bf}, {"w.f16", h}, {"ids", i64}, {"empty", empty}, {"nc", noncontig}},
           {{"format", "pt"}});
  auto f = st::File::open((d / "a.safetensors").string());
  CHECK(f->tensors().size() == 6);
  CHECK(f->metadata().at("format") == "pt");
  CHECK(at::equal(f->get("w.f32"), f32));
  CHECK(at::equal(f->get("w.bf16"), bf));
  CHECK(at::equal(f->get("w.f16"), h));
  CHECK(at::equal(f->get("ids"), i64));
  CHECK(at::equal(f->get("nc"), noncontig));
  CHECK(f->get("empty").sizes().vec() == std::vector<int64_t>{0, 4});
  CHECK(f->find("w.bf16")->dtype == "BF16");
  CHECK_THROWS_WITH_AS(f->get("nope"), doctest::Contains("no tensor 'nope'"), ax::UsageError);
  // No temp files left behind by the atomic writer.
  int count = 0;
  for (auto& e : fs::directory_iterator(d)) (void)e, ++count;
  CHECK(count == 1);
  ax::test::remove_tree(d);
}

TEST_CASE("safetensors: the writer rejects duplicate names") {
  auto d = temp_dir("dup");
  CHECK_THROWS_AS(st::save((d / "x.safetensors").string(), {{"a", at::zeros({1})}, {"a", at::zeros({1})}}),
                  ax::UsageError);
  CHECK(!fs::exists(d / "x.safetensors"));
  ax::test::remove_tree(d);
}

TEST_CASE("safetensors: corrupt files give errors naming the file and tensor") {
  auto d = temp_dir("bad");
  auto p = d / "bad.safetensors";
  std::string data8(8, '\0');
  auto hdr = [](json j) { return j.dump(); };
  json good = {{"t", {{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {0, 8}}}}};

  write_raw(p, hdr(good), data8);
  CHECK(error_of(p).empty());

  {  // shorter than the length prefix
    std::ofstream(p, std::ios::binary) << "abc";
    CHECK(error_of(p).find("truncated") != std::string::npos);
  }
  write_raw(p, hdr(good), data8, 1 << 20);  // header length beyond the file
  CHECK(error_of(p).find("exceeds") != std::string::npos);
  write_raw(p, hdr(good), data8, int64_t(1) << 40);  // absurd header length
  CHECK(error_of(p).find("implausible") != std::string::npos);
  write_raw(p, "{not json", data8);
  CHECK(error_of(p).find("not valid JSON") != std::string::npos);
  write_raw(p, "[1,2]", "");
  CHECK(error_of(p).find("not a JSON object") != std::string::npos);
  write_raw(p, hdr(good), std::string(4, '\0'));  // data truncated
  {
    auto e = error_of(p);
    CHECK(e.find("tensor 't'") != std::string::npos);
    CHECK(e.find(p.string()) != std::string::npos);
  }
  json wrong_size = {{"t", {{"dtype", "F32"}, {"shape", {3}}, {"data_offsets", {0, 8}}}}};
  write_raw(p, hdr(wrong_size), data8);
  CHECK(error_of(p).find("shape x dtype size is 12 bytes") != std::string::npos);
  json bad_dtype = {{"t", {{"dtype", "Q4"}, {"shape", {2}}, {"data_offsets", {0, 8}}}}};
  write_raw(p, hdr(bad_dtype), data8);
  CHECK(error_of(p).find("unsupported dtype 'Q4'") != std::string::npos);
  json neg_shape = {{"t", {{"dtype", "F32"}, {"shape", {-2}}, {"data_offsets", {0, 8}}}}};
  write_raw(p, hdr(neg_shape), data8);
  CHECK(error_of(p).find("non-negative") != std::string::npos);
  json overflow = {{"t", {{"dtype", "F32"}, {"shape", {uint64_t(1) << 62, 8}}, {"data_offsets", {0, 8}}}}};
  write_raw(p, hdr(overflow), data8);
  CHECK(error_of(p).find("overflow") != std::string::npos);
  json backwards = {{"t", {{"dtype", "F32"}, {"shape", {0}}, {"data_offsets", {8, 0}}}}};
  write_raw(p, hdr(backwards), data8);
  CHECK(error_of(p).find("before begin") != std::string::npos);
  json overlap = {{"a", {{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {0, 8}}}},
                  {"b", {{"dtype", "F32"}, {"shape", {1}}, {"data_offsets", {4, 8}}}}};
  write_raw(p, hdr(overlap), data8);
  {
    auto e = error_of(p);
    CHECK(e.find("overlaps") != std::string::npos);
    CHECK(e.find("'b'") != std::string::npos);
  }
  json hole = {{"a", {{"dtype", "F32"}, {"shape", {1}}, {"data_offsets", {4, 8}}}}};
  write_raw(p, hdr(hole), data8);
  CHECK(error_of(p).find("hole") != std::string::npos);
  write_raw(p, hdr(good), data8 + "junk");  // trailing bytes nobody owns
  CHECK(error_of(p).find("cover 8") != std::string::npos);
  json missing = {{"t", {{"dtype", "F32"}, {"shape", {2}}}}};
  write_raw(p, hdr(missing), data8);
  CHECK(error_of(p).find("data_offsets") != std::string::npos);
  json extra = {{"t", {{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {0, 8}}, {"x", 1}}}};
  write_raw(p, hdr(extra), data8);
  CHECK(error_of(p).find("unknown field 'x'") != std::string::npos);
  CHECK(error_of(d / "missing.safetensors").find("cannot open") != std::string::npos);
  ax::test::remove_tree(d);
}

TEST_CASE("safetensors: sharded checkpoints are validated against their index") {
  auto d = temp_dir("shard");
  st::save((d / "s1.safetensors").string(), {{"a", at::ones({2})}, {"b", at::zeros({3})}});
  st::save((d / "s2.safetensors").string(), {{"c", at::full({4}, 2.0)}});
  json idx = {{"metadata", {{"total_size", 36}}},
              {"weight_map", {{"a", "s1.safetensors"}, {"b", "s1.safetensors"}, {"c", "s2.safetensors"}}}};
  st::write_file_atomic((d / "model.safetensors.index.json").string(), idx.dump());
  auto c = st::Checkpoint::open_dir(d.string());
  CHECK(c.names() == std::vector<std::string>{"a", "b", "c"});
  CHECK(at::equal(c.get("c"), at::full({4}, 2.0)));
  CHECK(c.file_of("b") == (d / "s1.safetensors").string());
  CHECK_THROWS_WITH_AS(c.get("zz"), doctest::Contains("missing tensor 'zz'"), ax::UsageError);

  idx["weight_map"]["d"] = "s2.safetensors";  // listed but absent
  st::write_file_atomic((d / "model.safetensors.index.json").string(), idx.dump());
  CHECK_THROWS_WITH_AS(st::Checkpoint::open_dir(d.string()), doctest::Contains("no tensor 'd'"), ax::UsageError);
  idx["weight_map"].erase("d");
  idx["weight_map"].erase("b");  // present but unlisted
  st::write_file_atomic((d / "model.safetensors.index.json").string(), idx.dump());
  CHECK_THROWS_WITH_AS(st::Checkpoint::open_dir(d.string()), doctest::Contains("'b' is not listed"), ax::UsageError);
  idx["weight_map"]["b"] = "../evil.safetensors";
  st::write_file_atomic((d / "model.safetensors.index.json").string(), idx.dump());
  CHECK_THROWS_AS(st::Checkpoint::open_dir(d.string()), ax::UsageError);
  idx["weight_map"]["b"] = "s1.safetensors";
  idx["weight_map"]["e"] = "s3.safetensors";
  st::write_file_atomic((d / "model.safetensors.index.json").string(), idx.dump());
  CHECK_THROWS_WITH_AS(st::Checkpoint::open_dir(d.string()), doctest::Contains("does not exist"), ax::UsageError);
  fs::remove(d / "model.safetensors.index.json");
  CHECK_THROWS_WITH_AS(st::Checkpoint::open_dir(d.string()), doctest::Contains("no model.safetensors"), ax::UsageError);
  ax::test::remove_tree(d);
}
TEST_CASE("safetensors: files written by the Python safetensors package read back") {
  // tests/data/models/*/model.safetensors are written by HF (scripts/goldens/make_model_goldens.py).
  fs::path p = fs::path(AXENGINE_TEST_DATA_DIR) / "models" / "llama" / "model.safetensors";
  REQUIRE(fs::exists(p));
  auto f = st::File::open(p.string());
  CHECK(f->find("model.embed_tokens.weight") != nullptr);
  CHECK(f->get("model.embed_tokens.weight").dim() == 2);
}
