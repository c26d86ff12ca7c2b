// The generic strided loop (loop.hpp) for the float and complex dtypes.
#include "loop_impl.hpp"

namespace tsk {

TSK_LOOP_INSTANCE(float)
TSK_LOOP_INSTANCE(double)
TSK_LOOP_INSTANCE(c64)
TSK_LOOP_INSTANCE(c128)

} // namespace tsk
