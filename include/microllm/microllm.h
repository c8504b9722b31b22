// The whole C++ API of microLLM. (The C API is microllm/capi/microllm.h.)
#pragma once

#include "microllm/backend/backend.h"
#include "microllm/core/device.h"
#include "microllm/core/dtype.h"
#include "microllm/core/error.h"
#include "microllm/core/random.h"
#include "microllm/core/shape.h"
#include "microllm/core/storage.h"
#include "microllm/core/tensor.h"
#include "microllm/core/threads.h"
#include "microllm/core/cuda.h"
#include "microllm/ops/ops.h"
#include "microllm/tokenizer/chat_template.h"
#include "microllm/tokenizer/tokenizer.h"
#include "microllm/version.h"
