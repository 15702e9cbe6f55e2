#include <doctest/doctest.h>

#include "axengine/strings.hpp"

TEST_CASE("closest suggests a near key and nothing for unrelated words") {
  std::vector<std::string> keys = {"sequence_len", "micro_batch_size", "learning_rate"};
  CHECK(ax::closest("sequence_length", keys) == "sequence_len");
  CHECK(ax::closest("learnig_rate", keys) == "learning_rate");
  CHECK(ax::closest("zzz", keys).empty());
  CHECK(ax::edit_distance("kitten", "sitting") == 3);
  CHECK(ax::edit_distance("modle", "model") == 1);
  CHECK(ax::closest("modle", {"run", "model"}) == "model");
}
