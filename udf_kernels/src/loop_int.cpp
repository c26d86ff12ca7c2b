// The generic strided loop (loop.hpp) for the integer dtypes.
#include "loop_impl.hpp"

namespace tsk {

TSK_LOOP_INSTANCE(int8_t)
TSK_LOOP_INSTANCE(int16_t)
TSK_LOOP_INSTANCE(int32_t)
TSK_LOOP_INSTANCE(int64_t)
TSK_LOOP_INSTANCE(uint8_t)
TSK_LOOP_INSTANCE(uint16_t)
TSK_LOOP_INSTANCE(uint32_t)
TSK_LOOP_INSTANCE(uint64_t)

} // namespace tsk
