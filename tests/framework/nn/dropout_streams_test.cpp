// The random streams of a module tree (module.h, "Random streams"): every nn::Dropout of a model
// draws its own masks without seeds from the user, derived from one seed per tree and the
// generator's dotted name; the same model built twice draws the same masks; an explicit seed is
// kept; seed_generators reseeds a tree, and a module seeded on its own keeps its streams when it
// is wrapped.

#include <gtest/gtest.h>

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "framework/nn/activation.h"
#include "framework/nn/dropout.h"
#include "framework/nn/linear.h"
#include "framework/nn/sequential.h"
#include "framework/tensor/nn_ops.h"
#include "framework/tensor/ops.h"

namespace hsgd::nn {
namespace {

// The mask a dropout module draws next: its output on ones (0 or 1/(1-p)).
std::vector<float> next_mask(Module& dropout) { return dropout.forward(ones({256})).to_vector(); }

// The mask of the dropout at `index` of a Sequential.
std::vector<float> next_mask(Sequential& net, size_t index) { return next_mask(*net[index]); }

// Dropout - Linear - Dropout - (Dropout - ReLU): three unseeded streams at two depths.
std::shared_ptr<Sequential> tree() {
  Generator init(1);
  auto net = std::make_shared<Sequential>();
  net->push_back(std::make_shared<Dropout>(0.5));
  net->push_back(std::make_shared<Linear>(4, 4, true, init));
  net->push_back(std::make_shared<Dropout>(0.5));
  auto inner = std::make_shared<Sequential>();
  inner->push_back(std::make_shared<Dropout>(0.5));
  inner->push_back(std::make_shared<ReLU>());
  net->push_back(inner);
  return net;
}

// The first mask of each of tree()'s three dropout layers.
std::vector<std::vector<float>> first_masks(Sequential& net) {
  auto& inner = dynamic_cast<Sequential&>(*net[3]);
  return {next_mask(net, 0), next_mask(net, 2), next_mask(inner, 0)};
}

TEST(DropoutStreamsTest, LayersOfOneModel_DrawDifferentMasks) {
  auto net = tree();
  const auto masks = first_masks(*net);
  EXPECT_NE(masks[0], masks[1]) << "layers 0 and 2 drew the same mask";
  EXPECT_NE(masks[0], masks[2]) << "layers 0 and 3.0 drew the same mask";
  EXPECT_NE(masks[1], masks[2]) << "layers 2 and 3.0 drew the same mask";
  // Control: two layers with one explicit seed do draw the same masks, so the check can fail.
  Dropout a(0.5, 3), b(0.5, 3);
  EXPECT_EQ(next_mask(a), next_mask(b));
}

TEST(DropoutStreamsTest, SameModelBuiltTwice_DrawsTheSameMasks) {
  auto first = tree(), second = tree();
  EXPECT_EQ(first_masks(*first), first_masks(*second));
  // Seeded alike after building: the same masks again; another seed: other masks.
  auto third = tree(), fourth = tree(), fifth = tree();
  third->seed_generators(42);
  fourth->seed_generators(42);
  fifth->seed_generators(43);
  const auto masks = first_masks(*third);
  EXPECT_EQ(masks, first_masks(*fourth));
  const auto other = first_masks(*fifth);
  for (size_t i = 0; i < masks.size(); ++i) EXPECT_NE(masks[i], other[i]) << "layer " << i;
}

// The contract in numbers: a stream is Generator(derive_seed(tree seed, dotted name)).
TEST(DropoutStreamsTest, Stream_IsDerivedFromTheTreeSeedAndTheDottedName) {
  auto net = tree();
  net->seed_generators(42);
  std::vector<std::string> names;
  for (const auto& [name, gen] : net->named_generators()) names.push_back(name);
  ASSERT_EQ(names, (std::vector<std::string>{"0.generator", "2.generator", "3.0.generator"}));
  const auto masks = first_masks(*net);
  for (size_t i = 0; i < names.size(); ++i) {
    Generator expected(derive_seed(42, names[i]));
    EXPECT_EQ(masks[i], dropout(ones({256}), 0.5, true, expected).to_vector()) << names[i];
  }
}

TEST(DropoutStreamsTest, ExplicitSeed_IsKeptInATreeAndBySeedGenerators) {
  Generator reference(7);
  const std::vector<float> expected = dropout(ones({256}), 0.5, true, reference).to_vector();
  auto net = std::make_shared<Sequential>();
  net->push_back(std::make_shared<Dropout>(0.5));
  net->push_back(std::make_shared<Dropout>(0.5, /*seed=*/7));
  net->seed_generators(99);
  EXPECT_EQ(next_mask(*net, 1), expected);
  EXPECT_NE(next_mask(*net, 0), expected);
  // Seed 0 given explicitly is a seed like any other (Generator(0)), not "no seed".
  Dropout zero(0.5, 0);
  Generator zero_reference(0);
  EXPECT_EQ(next_mask(zero), dropout(ones({256}), 0.5, true, zero_reference).to_vector());
}

// Without seed_generators the tree seed is initial_seed(), read when the root is built, so
// manual_seed changes the masks as torch.manual_seed does.
TEST(DropoutStreamsTest, DefaultTreeSeed_FollowsManualSeed) {
  manual_seed(5);
  const auto five = first_masks(*tree());
  manual_seed(6);
  const auto six = first_masks(*tree());
  manual_seed(5);
  EXPECT_EQ(initial_seed(), 5u);
  EXPECT_EQ(first_masks(*tree()), five);
  for (size_t i = 0; i < five.size(); ++i) EXPECT_NE(five[i], six[i]) << "layer " << i;
  manual_seed(kDefaultSeed);
  EXPECT_EQ(initial_seed(), kDefaultSeed);
}

// A block seeded on its own (e.g. a model that seeds itself from its options) keeps its streams
// when registered into a parent; seed_generators on the parent then takes them over.
TEST(DropoutStreamsTest, SeededBlock_KeepsItsStreamsWhenWrapped_UntilTheParentIsSeeded) {
  auto alone = tree();
  alone->seed_generators(3);
  const auto own = first_masks(*alone);

  auto block = tree();
  block->seed_generators(3);
  auto parent = std::make_shared<Sequential>();
  parent->push_back(std::make_shared<Dropout>(0.5));
  parent->push_back(block);
  EXPECT_EQ(first_masks(*block), own);

  parent->seed_generators(3);  // now "1.0.generator", ... of the parent's tree
  const auto taken_over = first_masks(*block);
  for (size_t i = 0; i < own.size(); ++i) EXPECT_NE(taken_over[i], own[i]) << "layer " << i;
  Generator expected(derive_seed(3, "1.0.generator"));
  EXPECT_EQ(taken_over[0], dropout(ones({256}), 0.5, true, expected).to_vector());
}

TEST(DeriveSeedTest, DistinctNamesAndSeeds_GiveDistinctSeeds) {
  std::set<uint64_t> seen;
  for (int i = 0; i < 2000; ++i) {
    const std::string name = "blocks." + std::to_string(i) + ".attn_dropout.generator";
    EXPECT_TRUE(seen.insert(derive_seed(1, name)).second) << name;
    EXPECT_TRUE(seen.insert(derive_seed(2, name)).second) << name << " with seed 2";
  }
  EXPECT_TRUE(seen.insert(derive_seed(1, "")).second);
  EXPECT_NE(derive_seed(1, "a"), derive_seed(1, std::string("a\0", 2)));
  EXPECT_EQ(derive_seed(1, "0.generator"), derive_seed(1, "0.generator"));
}

}  // namespace
}  // namespace hsgd::nn
