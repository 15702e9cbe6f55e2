#include "data/register.hpp"

#include "data/types.hpp"

namespace ax::data {

void register_builtin_datasets(Registry& registry) {
  Provider c;
  c.info.kind = ProviderKind::dataset;
  c.info.name = "completion";
  c.info.summary = "text rows (optional prompt without loss), tokenised by the model's tokenizer";
  c.object = make_completion_type();
  registry.add(std::move(c));
  Provider p;
  p.info.kind = ProviderKind::dataset;
  p.info.name = "pretokenized";
  p.info.summary = "rows of input_ids (optional labels, attention_mask), validated against the vocabulary";
  p.object = make_pretokenized_type();
  registry.add(std::move(p));
  Provider a;
  a.info.kind = ProviderKind::dataset;
  a.info.name = "alpaca";
  a.info.summary = "instruction/input/output rows in the Stanford Alpaca prompt format; loss on the output only";
  a.object = make_alpaca_type();
  registry.add(std::move(a));
  Provider ct;
  ct.info.kind = ProviderKind::dataset;
  ct.info.name = "chat_template";
  ct.info.summary = "conversations (messages lists) rendered with the model's chat template; loss on assistant turns";
  ct.object = make_chat_template_type(&registry);
  registry.add(std::move(ct));
}

}  // namespace ax::data
