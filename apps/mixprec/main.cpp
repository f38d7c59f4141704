// mixprec command-line entry point.
#include <cstdio>
int main() { std::puts("mixprec: CLI under construction"); return 1; }
