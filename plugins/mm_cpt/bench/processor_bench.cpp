// Processor throughput: 640x480 JPEGs decoded and processed (Qwen2-VL defaults: min 3136, max 1003520 pixels)
// by the C++ path, over oneTBB's threads. Prints one JSON line; compare with processor_bench.py (transformers'
// fast processor on the same images, the same machine).
//   mm_processor_bench <dir of .jpg> [images=256] [threads=0 (all)]
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
  if (argc < 2) {
    std::fprintf(stderr, "usage: mm_processor_bench <dir of images> [images=256] [threads=0]\n");
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
  ax::mm::ProcessorConfig cfg;
  std::vector<int64_t> patches(n);
  auto run = [&] {
    tbb::parallel_for(std::size_t(0), n, [&](std::size_t i) {
      const auto& f = files[i % files.size()];
      ax::mm::Image img = ax::mm::decode_image(f.data(), f.size(), "bench", {});
      patches[i] = ax::mm::process_image(img, cfg).pixel_values.size(0);
    });
  };
  run();  // warm-up
  auto t0 = std::chrono::steady_clock::now();
  run();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("{\"bench\": \"mm_cpt processor\", \"images\": %zu, \"threads\": %d, \"patches_per_image\": %lld, "
              "\"seconds\": %.4f, \"images_per_s\": %.1f}\n",
              n, threads > 0 ? threads : tbb::this_task_arena::max_concurrency(), static_cast<long long>(patches[0]), s, n / s);
  return 0;
}
