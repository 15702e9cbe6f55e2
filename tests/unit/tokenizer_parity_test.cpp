// Exact parity with HF tokenizers on tokenizers trained by scripts/goldens/make_tokenizer_goldens.py: ids with
// and without special tokens, decode with and without skipping specials, bos/eos/pad and vocabulary size.
#include <doctest/doctest.h>

#include "unit/tokenizer_test_util.hpp"

TEST_CASE("tokenizer parity: Qwen2-style byte-level BPE matches HF tokenizers") {
  // What HF does not round-trip either: NFC/NFKC-changed text and spaces eaten by lstrip/rstrip <mask>.
  CHECK(ax::test::check_against_hf_goldens("qwen2_bytelevel") >= 65);
}

TEST_CASE("tokenizer parity: Llama3-style byte-level BPE with ignore_merges matches HF tokenizers") {
  CHECK(ax::test::check_against_hf_goldens("llama3_bytelevel") >= 47);
}

TEST_CASE("tokenizer parity: Llama2-style Metaspace BPE with byte fallback matches HF tokenizers") {
  CHECK(ax::test::check_against_hf_goldens("llama2_metaspace") >= 58);
}

TEST_CASE("tokenizer parity: Mistral-style Metaspace pre-tokenizer with fused unk matches HF tokenizers") {
  CHECK(ax::test::check_against_hf_goldens("mistral_metaspace_unk") >= 9);
}

// The same vocabularies under the other supported components (see the golden script's docstring).
TEST_CASE("tokenizer parity: GPT-2 ByteLevel regex with prefix space, NFD, Strip and Roberta processing") {
  CHECK(ax::test::check_against_hf_goldens("gpt2_bytelevel_variant") >= 2);  // the prefix space never round-trips
}

TEST_CASE("tokenizer parity: every Split behavior, invert, Digits, regex Replace and NFKC") {
  CHECK(ax::test::check_against_hf_goldens("split_behaviors_variant") >= 28);
}

TEST_CASE("tokenizer parity: Metaspace split=true, individual digits, NFKD and an eos-only template") {
  CHECK(ax::test::check_against_hf_goldens("metaspace_split_variant") >= 13);
}

// Files written by transformers 5 itself (Qwen2Tokenizer / LlamaTokenizer around the vocabularies above): the
// families' real pipeline configuration, e.g. Llama's Metaspace prepend_scheme "first" without a normalizer.
TEST_CASE("tokenizer parity: tokenizer.json written by transformers' Qwen2Tokenizer") {
  CHECK(ax::test::check_against_hf_goldens("transformers_qwen2") >= 66);
}

TEST_CASE("tokenizer parity: tokenizer.json written by transformers' LlamaTokenizer") {
  CHECK(ax::test::check_against_hf_goldens("transformers_llama") >= 67);
}
