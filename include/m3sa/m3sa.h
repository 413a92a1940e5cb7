#pragma once
// m3sa: MiniMax-M3 sparse attention (MSA) for inference engines. Host-only umbrella header: it
// needs neither CUDA nor any framework to include.
#include "m3sa/batch.h"
#include "m3sa/capabilities.h"
#include "m3sa/config.h"
#include "m3sa/context_parallel.h"
#include "m3sa/numeric.h"
#include "m3sa/ops.h"
#include "m3sa/registry.h"
#include "m3sa/status.h"
#include "m3sa/tensor_view.h"
#include "m3sa/types.h"
#include "m3sa/version.h"
