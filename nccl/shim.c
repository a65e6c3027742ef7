// The C half of package nccl lives in csrc/; this file compiles it into the package.
#include "../csrc/nccl_loader.c"
