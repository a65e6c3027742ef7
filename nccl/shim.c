// The C half of package nccl lives in csrc/; this file compiles it into the package.
//
// The go command does not notice edits to files #included from outside the package, so the
// digest below names the csrc content this package was last built from; TestShimDigest fails
// (printing the new line) when csrc changed, and updating the line makes Go rebuild.
// csrc-digest: 646e97470a28d457
#include "../csrc/nccl_loader.c"
