// The C half of package cuda lives in csrc/; this file compiles it into the package.
#include "../csrc/cuda_loader.c"
