// C-simulation test bench, SCORE_TOPK selection (placeholder until the selection golden sets).
#include "tb_common.h"

int run_select(Reader&, const std::string& name, int&, int&) {
    std::printf("FAIL %s: selection sets not supported yet\n", name.c_str());
    return -1;
}
