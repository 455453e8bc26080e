// The output element types a kernel writes.
#pragma once

namespace flexbatch {

enum OutKind { OUT_F32 = 0, OUT_BF16 = 1 };

}  // namespace flexbatch
