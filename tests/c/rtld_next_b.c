/* rtld_next_b.c: the next definition of rtld_next_probe (see rtld_next_a.c). */
int rtld_next_probe(void) { return 2; }
