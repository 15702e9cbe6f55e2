// The mm_cpt plugin: multimodal continued pre-training data (docs/plugins/mm_cpt.md). Registers the `mm_cpt`
// dataset type: image + text rows (raw or tokenized) decoded with libjpeg-turbo / libpng / libwebp and
// processed by the C++ Qwen2-VL image processor (processor.hpp) into pixel_values + image_grid_thw extras.
#include <axengine/plugin.hpp>

#include "mm_dataset.hpp"

AXENGINE_PLUGIN_DESCRIPTOR(
    "{\"name\": \"mm_cpt\", \"version\": \"0.1.0\","
    " \"summary\": \"multimodal continued pre-training data: JPEG/PNG/WebP decoding, the Qwen2-VL image processor,"
    " image+text dataset rows\","
    " \"providers\": [{\"kind\": \"dataset\", \"name\": \"mm_cpt\"}]}")

AXENGINE_PLUGIN_REGISTER(reg) { reg.dataset_type("mm_cpt", std::make_shared<ax::mm::MmCptType>()); }
