// The paged attention plan (src/backend/paged_decode_plan.h) on an H100's limits, with no GPU: the kernel each decode
// shape gets, the launch policies' documented choices (docs/CUDA.md, paged attention), and the invariants every plan
// keeps over a sweep of shapes. The CUDA suite checks that the launched kernels compute the composition.
#include "../../src/backend/paged_decode_plan.h"

#include <gtest/gtest.h>

#include <algorithm>

#include <string>
#include <vector>

namespace microllm::paged_plan {
namespace {

const DeviceLimits kH100{132, 90, 227 * 1024};

// sm_90 holds a cluster of up to 16 CTAs whose shared memory each fits one SM.
bool h100_clusters_fit(const DecodePlan& p) {
  const size_t smem = p.kernel == DecodeKernel::split_projected ? p.combine_smem : p.smem;
  return p.cluster <= 16 && static_cast<int64_t>(smem) <= kH100.max_smem_optin;
}

struct Model {
  const char* name;
  int q_heads, kv_heads, dim, hidden;
};
const Model kQwen05{"Qwen2.5-0.5B", 14, 2, 64, 896};
const Model kR1_15{"R1-Distill-1.5B", 12, 2, 128, 1536};
const Model kLlamaLike{"32/8 x 128", 32, 8, 128, 4096};
const Model kMha{"16/16 x 64", 16, 16, 64, 1024};
const Model kMqa{"8/1 x 64", 8, 1, 64, 512};

DecodeShape bf16_shape(const Model& m, int64_t tokens, int64_t context) {
  DecodeShape s;
  s.tokens = tokens;
  s.max_context = context;
  s.q_heads = m.q_heads;
  s.kv_heads = m.kv_heads;
  s.dim = m.dim;
  s.element_bytes = 2;
  s.tensor_cores = m.dim % 16 == 0;
  s.hidden = m.hidden;
  s.o_in = m.q_heads * m.dim;
  return s;
}

DecodePlan projected_plan(const DecodeShape& s, const DecodePolicy& policy = {},
                          const ClustersFit& fits = h100_clusters_fit) {
  return plan_attention_projected(s, kH100, policy, fits);
}

TEST(PagedDecodePlan, QwenDecodeGetsTheDocumentedKernels) {
  // One chunk of context: one query head a CTA, the o projection in the same kernel, 4 replicas at batch 1 and 2
  // at batch 2 (within half the SMs).
  DecodePlan p = projected_plan(bf16_shape(kQwen05, 1, 256));
  EXPECT_EQ(p.kernel, DecodeKernel::projected) << p.describe();
  EXPECT_EQ(p.replicas, 4);
  EXPECT_EQ(p.cluster, 14u);
  EXPECT_EQ(p.grid_x, 14);
  EXPECT_EQ(p.grid_y, 4);
  EXPECT_TRUE(p.rows_staged);
  EXPECT_EQ(projected_plan(bf16_shape(kQwen05, 2, 256)).replicas, 2);

  // A 4,096-key graph: a token's cluster of 2 kv heads x 8 slices of 512 keys on the tensor cores.
  p = projected_plan(bf16_shape(kQwen05, 1, 4096));
  EXPECT_EQ(p.kernel, DecodeKernel::token_cluster) << p.describe();
  EXPECT_EQ(p.slices, 8);
  EXPECT_EQ(p.cluster, 16u);
  EXPECT_EQ(p.chunk, 512);
  EXPECT_EQ(projected_plan(bf16_shape(kQwen05, 2, 4096)).kernel, DecodeKernel::token_cluster);

  // Without token clusters the same graph takes head clusters (16 slices of 256 keys a kv head).
  DecodePolicy no_token_clusters;
  no_token_clusters.token_clusters = false;
  p = projected_plan(bf16_shape(kQwen05, 1, 4096), no_token_clusters);
  EXPECT_EQ(p.kernel, DecodeKernel::head_clusters) << p.describe();
  EXPECT_EQ(p.slices, 16);
  EXPECT_EQ(p.grid_x, 2 * 16);

  // Past both: the splits with the projected combine.
  p = projected_plan(bf16_shape(kQwen05, 1, 8192));
  EXPECT_EQ(p.kernel, DecodeKernel::split_projected) << p.describe();
  EXPECT_GT(p.n_split, 1);
  EXPECT_EQ(p.combine_grid_x, 14);

  // Past 2 tokens the o projection runs on its own.
  EXPECT_EQ(projected_plan(bf16_shape(kQwen05, 8, 256)).kernel, DecodeKernel::composition);
  EXPECT_EQ(projected_plan(bf16_shape(kQwen05, 32, 4096)).kernel, DecodeKernel::composition);
}

// Gemma 3 270M (4 query heads of D 256 over one kv head): one query head a CTA while its chunk holds the keys
// (128 of D 256), then a token's cluster of 16 slices of the one kv head rather than a CTA's splits and a combine.
TEST(PagedDecodePlan, GemmaHeadsKeepTheProjectionPastOneChunk) {
  const Model gemma{"Gemma 3 270M", 4, 1, 256, 640};
  auto shape = [&](int64_t tokens, int64_t context) {
    DecodeShape s = bf16_shape(gemma, tokens, context);
    s.tensor_cores = false;  // D 256: the CUDA cores (paged_attention.cu compiles the tensor-core phases for 64, 128)
    return s;
  };
  DecodePlan p = projected_plan(shape(1, 128));
  EXPECT_EQ(p.kernel, DecodeKernel::projected) << p.describe();
  EXPECT_EQ(p.n_split, 1);
  for (int64_t context : {256, 512, 2048}) {
    p = projected_plan(shape(1, context));
    EXPECT_EQ(p.kernel, DecodeKernel::token_cluster) << context << ": " << p.describe();
    EXPECT_EQ(p.slices, 16);
    EXPECT_EQ(p.cluster, 16u);
    EXPECT_EQ(p.chunk, std::max<int64_t>(32, context / 16));
  }
  EXPECT_EQ(projected_plan(shape(2, 256)).kernel, DecodeKernel::token_cluster);
  EXPECT_EQ(projected_plan(shape(8, 256)).kernel, DecodeKernel::composition);  // past 2 tokens: the o GEMV
  // paged_attention alone: one row a CTA within the chunk, the group's rows together past it.
  EXPECT_EQ(plan_attention(shape(1, 128), kH100).rows_per_cta, 1);
  EXPECT_EQ(plan_attention(shape(1, 256), kH100).rows_per_cta, kRowsPerCta);
  // Past the tokens a cluster takes, one row a CTA up to kMaxChunk keys: at batch 8, 32 CTAs of one head before
  // the splits, where whole groups would be 8.
  p = plan_attention(shape(8, 256), kH100);
  EXPECT_EQ(p.rows_per_cta, 1) << p.describe();
  EXPECT_EQ(p.grid_x, 8 * 4) << p.describe();
  EXPECT_EQ(plan_attention(shape(8, 512), kH100).rows_per_cta, kRowsPerCta);
}

TEST(PagedDecodePlan, RowsPastTheProjectionBudgetsKeepTheOGemv) {
  // R1-Distill-1.5B's o rows (3 KB) fit neither the staged nor the streamed budget at one chunk of context.
  EXPECT_EQ(projected_plan(bf16_shape(kR1_15, 1, 256)).kernel, DecodeKernel::composition);
}

TEST(PagedDecodePlan, SwitchesDtypesAndLayoutsFallBack) {
  const DecodeShape s = bf16_shape(kQwen05, 1, 256);
  DecodePolicy off;
  off.fuse_projection = false;
  EXPECT_EQ(projected_plan(s, off).kernel, DecodeKernel::composition);

  DecodeShape f32 = s;
  f32.element_bytes = 4;
  EXPECT_EQ(projected_plan(f32).kernel, DecodeKernel::composition);

  DecodeShape unaligned = s;
  unaligned.aligned_weight = false;
  EXPECT_EQ(projected_plan(unaligned).kernel, DecodeKernel::composition);

  DeviceLimits ampere = kH100;
  ampere.compute_capability = 80;
  EXPECT_EQ(plan_attention_projected(s, ampere, {}, h100_clusters_fit).kernel, DecodeKernel::composition);

  DecodePolicy three;
  three.forced_replicas = 3;
  EXPECT_EQ(projected_plan(s, three).replicas, 3);

  // A device that holds no cluster of the token's kernel: the next candidate, then the composition.
  auto no_token_cluster = [](const DecodePlan& p) {
    return p.kernel != DecodeKernel::token_cluster && h100_clusters_fit(p);
  };
  EXPECT_EQ(projected_plan(bf16_shape(kQwen05, 1, 4096), {}, no_token_cluster).kernel, DecodeKernel::head_clusters);
  EXPECT_EQ(projected_plan(s, {}, [](const DecodePlan&) { return false; }).kernel, DecodeKernel::composition);

  // Pools the staged kernel cannot read: the simple kernel for paged_attention, the composition for the fusions.
  DecodeShape odd = s;
  odd.aligned_pools = false;
  EXPECT_EQ(plan_attention(odd, kH100).kernel, DecodeKernel::simple);
  EXPECT_EQ(plan_attention(odd, kH100, DecodeKernel::composition).kernel, DecodeKernel::composition);
  DecodeShape wide = s;
  wide.dim = 320;
  EXPECT_EQ(plan_attention(wide, kH100).kernel, DecodeKernel::simple);
}

// A sliding window bounds the keys a token attends to: a windowed layer at a long context gets the plan of a context
// as long as the window (the kernels start at the window's first key), not a fallback.
TEST(PagedDecodePlan, AWindowPlansLikeAContextOfItsLength) {
  const Model gemma{"Gemma 3 270M", 4, 1, 256, 640};
  for (const Model& m : {kQwen05, gemma}) {
    for (int64_t tokens : {1, 8}) {
      DecodeShape windowed = bf16_shape(m, tokens, 4096);
      windowed.window = 512;
      const DecodeShape short_context = bf16_shape(m, tokens, 512);
      const DecodePlan a = projected_plan(windowed), b = projected_plan(short_context);
      if (tokens == 1) {  // B8 at 512 keys projects with o's GEMV
        EXPECT_NE(a.kernel, DecodeKernel::composition) << m.name;
      }
      EXPECT_EQ(a.describe(), b.describe()) << m.name << " B" << tokens;
      EXPECT_EQ(plan_attention(windowed, kH100).describe(), plan_attention(short_context, kH100).describe());
    }
  }
  DecodeShape wider = bf16_shape(kQwen05, 1, 256);
  wider.window = 4096;  // a window past the context hides nothing
  EXPECT_EQ(projected_plan(wider).describe(), projected_plan(bf16_shape(kQwen05, 1, 256)).describe());
}

TEST(PagedDecodePlan, StagedRowsAndSplitsFollowTheGrid) {
  // A small grid with one chunk: one query head a CTA, one split (no combine).
  DecodePlan p = plan_attention(bf16_shape(kQwen05, 1, 100), kH100);
  EXPECT_EQ(p.kernel, DecodeKernel::staged);
  EXPECT_EQ(p.rows_per_cta, 1);
  EXPECT_EQ(p.n_split, 1);
  EXPECT_EQ(p.chunk, 128);
  EXPECT_EQ(p.grid_x, 14);
  // Many tokens and a long context: whole GQA groups, splits, the combine.
  p = plan_attention(bf16_shape(kQwen05, 32, 2048), kH100);
  EXPECT_EQ(p.rows_per_cta, 8);
  EXPECT_EQ(p.grid_x, 32 * 2);
  EXPECT_GT(p.n_split, 1);
  EXPECT_EQ(p.grid_y, p.n_split);
  EXPECT_EQ(p.combine_grid_x, 32 * 14);
  EXPECT_EQ(p.combine_smem, static_cast<size_t>(p.n_split + 32) * sizeof(float));
}

// What every plan keeps, for each model shape, batch and context.
void expect_consistent(const DecodeShape& s, const DecodePlan& p) {
  const std::string where = std::string(kernel_name(p.kernel)) + " tokens " + std::to_string(s.tokens) + " context " +
                            std::to_string(s.max_context) + " heads " + std::to_string(s.q_heads) + "/" +
                            std::to_string(s.kv_heads) + ": " + p.describe();
  EXPECT_EQ(p.describe().rfind(kernel_name(p.kernel), 0), 0u) << where;
  if (p.kernel == DecodeKernel::composition || p.kernel == DecodeKernel::simple) return;
  EXPECT_LE(static_cast<int64_t>(p.smem), kH100.max_smem_optin) << where;
  EXPECT_LE(static_cast<int64_t>(p.combine_smem), kH100.max_smem_optin) << where;
  EXPECT_EQ(p.chunk % 32, 0) << where;
  EXPECT_GT(p.grid_x, 0) << where;
  EXPECT_GE(p.grid_y, 1) << where;
  EXPECT_EQ(p.threads, kStagedThreads) << where;
  EXPECT_EQ(p.pitch, s.dim + 16 / s.element_bytes) << where;
  EXPECT_EQ(p.stage_bytes % 16, 0) << where;
  if (p.slices > 0) {
    EXPECT_GE(int64_t{p.chunk} * p.slices, s.max_context) << where;  // the slices cover the context
  } else {
    EXPECT_GE(int64_t{p.chunk} * p.n_split, s.max_context) << where;  // the splits cover the context
    EXPECT_LT(int64_t{p.chunk} * (p.n_split - 1), s.max_context) << where;
    EXPECT_LE(p.n_split, kMaxSplits) << where;
    EXPECT_EQ(p.grid_x, s.tokens * s.kv_heads * p.row_blocks) << where;
    EXPECT_EQ(p.row_blocks, (s.q_heads / s.kv_heads + p.rows_per_cta - 1) / p.rows_per_cta) << where;
  }
  if (p.kernel == DecodeKernel::staged) {
    EXPECT_LE(p.smem, static_cast<size_t>(kMaxStagedSmem)) << where;
    return;
  }
  // The o projection: every output column computed by exactly one CTA of a replica set.
  EXPECT_LE(s.tokens, kMaxProjectedTokens) << where;
  EXPECT_GE(p.replicas, 1) << where;
  EXPECT_LE(p.replicas, kMaxReplicas) << where;
  EXPECT_LE(p.cluster, static_cast<unsigned>(kMaxClusterCtas)) << where;
  const int64_t column_ctas = p.kernel == DecodeKernel::head_clusters ? p.slices : s.q_heads;
  const int64_t ctas = p.kernel == DecodeKernel::token_cluster ? p.cluster : column_ctas;
  EXPECT_GE(int64_t{p.o_cols} * ctas * p.replicas, s.hidden) << where;
  EXPECT_EQ(p.rows_staged, p.replicas > 1) << where;
}

TEST(PagedDecodePlan, EveryPlanIsConsistentOverASweep) {
  int planned = 0;
  std::vector<int> seen(7, 0);
  for (const Model& m : {kQwen05, kR1_15, kLlamaLike, kMha, kMqa}) {
    for (int64_t tokens : {1, 2, 3, 8, 32, 64}) {
      for (int64_t context : {1, 31, 32, 100, 256, 257, 1000, 2048, 4096, 4097, 8192, 16384, 100000}) {
        const DecodeShape s = bf16_shape(m, tokens, context);
        const DecodePlan attention = plan_attention(s, kH100);
        expect_consistent(s, attention);
        const DecodePlan projected = projected_plan(s);
        expect_consistent(s, projected);
        ++seen[static_cast<int>(projected.kernel)];
        planned += 2;
      }
    }
  }
  EXPECT_EQ(planned, 5 * 6 * 13 * 2);
  for (DecodeKernel k : {DecodeKernel::projected, DecodeKernel::token_cluster, DecodeKernel::split_projected,
                         DecodeKernel::composition}) {
    EXPECT_GT(seen[static_cast<int>(k)], 0) << kernel_name(k) << " never chosen in the sweep";
  }
}

TEST(PagedDecodePlan, DescribeNamesTheLaunch) {
  const std::string line = projected_plan(bf16_shape(kQwen05, 1, 256)).describe();
  EXPECT_EQ(line, "projected: grid 14x4 of 256 threads, " +
                      std::to_string(projected_plan(bf16_shape(kQwen05, 1, 256)).smem) +
                      " B shared, clusters of 14; 1 row a CTA, chunk 256; o projection: 4 replicas x 16 columns a CTA, "
                      "rows staged");
  EXPECT_EQ(DecodePlan{}.describe(), "composition");
}

}  // namespace
}  // namespace microllm::paged_plan
