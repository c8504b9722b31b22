// Every operator of the ops layer.
#pragma once

#include "microllm/ops/activation.h"
#include "microllm/ops/attention.h"
#include "microllm/ops/elementwise.h"
#include "microllm/ops/indexing.h"
#include "microllm/ops/loss.h"
#include "microllm/ops/matmul.h"
#include "microllm/ops/norm.h"
#include "microllm/ops/norm_linear.h"
#include "microllm/ops/paged_attention.h"
#include "microllm/ops/qk_norm.h"
#include "microllm/ops/reduce.h"
#include "microllm/ops/rope.h"
#include "microllm/ops/sampling.h"
#include "microllm/ops/softmax.h"
