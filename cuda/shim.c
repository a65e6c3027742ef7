// The C half of package cuda lives in csrc/; this file compiles it into the package.
//
// The go command does not notice edits to files #included from outside the package, so the
// digest below names the csrc content this package was last built from; TestShimDigest fails
// (printing the new line) when csrc changed, and updating the line makes Go rebuild.
// csrc-digest: fc711be7676c58e3
#include "../csrc/cuda_loader.c"
