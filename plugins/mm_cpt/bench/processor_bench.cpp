// Processor throughput: JPEGs decoded and processed by the C++ path, over oneTBB's threads, with one family's image
// processor settings. Prints one JSON line; compare with processor_bench.py (transformers' fast processor of the
// same family on the same images, the same machine).
//   mm_processor_bench <dir of .jpg> [images=256] [threads=0 (all)] [family=qwen2_vl]
// Families (the settings of the hub checkpoints' preprocessor_config.json, as processor_bench.py sets them):
//   qwen2_vl  Qwen2-VL / Qwen2.5-VL: patch 14, min 3136, max 1003520 pixels, CLIP mean/std (ProcessorConfig's defaults)
//   qwen3_vl  Qwen3-VL: patch 16, shortest_edge 65536, longest_edge 16777216 pixels, mean/std 0.5
//   gemma3    Gemma 3 (4b/12b/27b): every image resized to 896 x 896 (bilinear, antialiased), mean/std 0.5
// On the 16-core GPU host (issue 40: >= 10x transformers' fast processor), after scripts/gpu-test.sh's build:
//   python3 plugins/mm_cpt/bench/processor_bench.py --make /tmp/mm_imgs
//   for f in qwen3_vl gemma3; do for t in 16 1; do /tmp/axbuild/bin/mm_processor_bench /tmp/mm_imgs 512 $t $f;
//     python3 plugins/mm_cpt/bench/processor_bench.py /tmp/mm_imgs 512 $t $f; done; done
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <tbb/global_control.h>
#include <tbb/parallel_for.h>

#include "image.hpp"
#include "processor.hpp"

int main(int argc, char** argv) {
  const std::string family = argc > 4 ? argv[4] : "qwen2_vl";
  if (argc < 2 || (family != "qwen2_vl" && family != "qwen3_vl" && family != "gemma3")) {
    std::fprintf(stderr, "usage: mm_processor_bench <dir of images> [images=256] [threads=0] [qwen2_vl|qwen3_vl|gemma3]\n");
    return 2;
  }
  std::vector<std::vector<std::uint8_t>> files;
  for (const auto& e : std::filesystem::directory_iterator(argv[1])) {
    std::ifstream in(e.path(), std::ios::binary);
    files.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  if (files.empty()) return 2;
  const std::size_t n = argc > 2 ? std::stoul(argv[2]) : 256;
  const int threads = argc > 3 ? std::stoi(argv[3]) : 0;
  std::unique_ptr<tbb::global_control> limit;
  if (threads > 0) limit = std::make_unique<tbb::global_control>(tbb::global_control::max_allowed_parallelism, threads);
  ax::mm::ProcessorConfig cfg;  // qwen2_vl: the defaults
  if (family == "qwen3_vl") {
    cfg.patch_size = 16;
    cfg.min_pixels = 65536;
    cfg.max_pixels = 16777216;
    cfg.image_mean = cfg.image_std = {0.5, 0.5, 0.5};
  }
  ax::mm::Gemma3ProcessorConfig gemma;
  gemma.height = gemma.width = 896;
  cfg.validate();
  gemma.validate();
  std::vector<int64_t> values(n);  // per image: patches (Qwen) or pixels x channels (Gemma 3)
  auto run = [&] {
    tbb::parallel_for(std::size_t(0), n, [&](std::size_t i) {
      const auto& f = files[i % files.size()];
      ax::mm::Image img = ax::mm::decode_image(f.data(), f.size(), "bench", {});
      values[i] = family == "gemma3" ? ax::mm::process_gemma3_image(img, gemma).numel()
                                     : ax::mm::process_image(img, cfg).pixel_values.size(0);
    });
  };
  run();  // warm-up
  auto t0 = std::chrono::steady_clock::now();
  run();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("{\"bench\": \"mm_cpt processor\", \"family\": \"%s\", \"images\": %zu, \"threads\": %d, \"%s\": %lld, "
              "\"seconds\": %.4f, \"images_per_s\": %.1f}\n",
              family.c_str(), n, threads > 0 ? threads : tbb::this_task_arena::max_concurrency(),
              family == "gemma3" ? "values_per_image" : "patches_per_image", static_cast<long long>(values[0]), s, n / s);
  return 0;
}
