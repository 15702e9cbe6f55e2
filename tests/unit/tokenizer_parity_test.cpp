// Exact parity with HF tokenizers on tokenizers trained by scripts/goldens/make_tokenizer_goldens.py: ids with
// and without special tokens, decode with and without skipping specials, bos/eos/pad and vocabulary size.
#include <doctest/doctest.h>

#include "unit/tokenizer_test_util.hpp"

TEST_CASE("tokenizer parity: Qwen2-style byte-level BPE matches HF tokenizers") {
  // What HF does not round-trip either: NFC/NFKC-changed text and spaces eaten by lstrip/rstrip <mask>.
  CHECK(ax::test::check_against_hf_goldens("qwen2_bytelevel") >= 33);
}

TEST_CASE("tokenizer parity: Llama3-style byte-level BPE with ignore_merges matches HF tokenizers") {
  CHECK(ax::test::check_against_hf_goldens("llama3_bytelevel") >= 32);
}

TEST_CASE("tokenizer parity: Llama2-style Metaspace BPE with byte fallback matches HF tokenizers") {
  CHECK(ax::test::check_against_hf_goldens("llama2_metaspace") >= 34);
}

TEST_CASE("tokenizer parity: Mistral-style Metaspace pre-tokenizer with fused unk matches HF tokenizers") {
  CHECK(ax::test::check_against_hf_goldens("mistral_metaspace_unk") >= 8);
}
