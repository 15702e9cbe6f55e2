# The core sources a fuzz-only build (scripts/fuzz.sh: AXENGINE_FUZZ=ON, BUILD_TESTING=OFF) compiles: the parsers the
# harnesses drive and everything they call, found by following undefined symbols from the parsers' objects. On a
# 2-core machine this halves the instrumented build. When a parser gains a dependency outside this list the fuzzers
# fail to link with an undefined reference: add the file it names here.
set(AX_FUZZ_CORE_SOURCES
  atomic_dir.cpp
  config/config.cpp
  config/config_binder.cpp
  crash_point.cpp
  data/completion.cpp
  data/data_config.cpp
  data/entry.cpp
  data/jsonl.cpp
  data/parquet.cpp
  data/pretokenized.cpp
  device.cpp
  error.cpp
  input_file.cpp
  kernel_op.cpp
  models/bnb_config.cpp
  models/hf_config.cpp
  models/lora.cpp
  ops/check.cpp
  ops/moe_experts.cpp
  ops/quant_formats.cpp
  plugins/descriptor.cpp
  plugins/descriptor_schema.cpp
  plugins/elf_section.cpp
  registry.cpp
  safetensors.cpp
  strings.cpp
  tokenizer/bpe.cpp
  tokenizer/decoders.cpp
  tokenizer/hf_tokenizer.cpp
  tokenizer/normalizers.cpp
  tokenizer/post_processors.cpp
  tokenizer/pre_tokenizers.cpp
  tokenizer/regex.cpp
  tokenizer/split.cpp
  tokenizer/unicode.cpp
  train/adamw.cpp
  train/checkpoint.cpp
  train/checkpoint_manifest.cpp
  train/lora_config.cpp
  train/train_config.cpp
  train/trainer_state.cpp
)
