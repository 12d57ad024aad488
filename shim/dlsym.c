/* dlsym.c: the dlsym interposer, the door through which every program that
 * finds the driver at run time (the static CUDA runtime, cuda-python, Triton,
 * PyTorch) gets pump's hooks instead of libcuda's functions.
 *
 * Rules it follows (research/INTERPOSITION.md section 9):
 *  - the real dlsym comes from dlvsym(RTLD_NEXT, ...), never from the public
 *    dlsym (that would be ourselves), and dlvsym is not interposed;
 *  - a lookup pump does not answer is forwarded as a TAIL JUMP from assembly,
 *    so glibc still sees the original caller (RTLD_NEXT is relative to it);
 *  - pump answers only exact names from its hook table, and only when the
 *    driver really has the symbol (otherwise the program sees what it would
 *    have seen without pump, NULL and dlerror() included).
 */
#include <dlfcn.h>
#include <string.h>

#include "hooks.h"

typedef void *(*dlsym_fn)(void *, const char *);

/* Read by the assembly trampoline below. */
PUMP_HIDDEN dlsym_fn pump_real_dlsym_ptr;

static void *dlsym_unavailable(void *handle, const char *name)
{
    (void)handle;
    (void)name;
    return NULL;
}

PUMP_HIDDEN dlsym_fn pump_real_dlsym(void)
{
    dlsym_fn fn = __atomic_load_n(&pump_real_dlsym_ptr, __ATOMIC_ACQUIRE);
    if (PUMP_LIKELY(fn != NULL))
        return fn;
    static const char *const versions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17"};
    for (size_t i = 0; i < sizeof versions / sizeof versions[0] && fn == NULL; i++)
        fn = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", versions[i]);
    if (fn == NULL)
        fn = dlsym_unavailable;  /* never jump to NULL */
    __atomic_store_n(&pump_real_dlsym_ptr, fn, __ATOMIC_RELEASE);
    return fn;
}

static bool looks_like_driver_symbol(const char *name)
{
    return name != NULL && name[0] == 'c' && name[1] == 'u' && name[2] >= 'A' && name[2] <= 'Z';
}

/* Called by the trampoline: the hook to return, or NULL to forward the lookup
 * to the real dlsym unchanged. */
PUMP_HIDDEN void *pump_dlsym_decide(void *handle, const char *name)
{
    dlsym_fn real = pump_real_dlsym();
    if (!looks_like_driver_symbol(name))
        return NULL;
    int id = pump_hook_find(name);
    if (id < 0 || atomic_load_explicit(&pump_passthrough, memory_order_relaxed))
        return NULL;
    /* Only answer where the driver answers: from pump's own position,
     * RTLD_DEFAULT would find pump's exports first, so look past them. */
    void *where = (handle == RTLD_DEFAULT) ? RTLD_NEXT : handle;
    if (real(where, name) == NULL)
        return NULL;
    return pump_hooks[id].hook;
}

/* dlsym itself: decide in C, then either return the hook or tail-jump to the
 * real dlsym with the caller's registers and return address intact. */
#if defined(__x86_64__)
__asm__(".text\n"
        ".globl dlsym\n"
        ".type dlsym, @function\n"
        "dlsym:\n"
        "  .cfi_startproc\n"
        "  pushq %rdi\n"
        "  .cfi_adjust_cfa_offset 8\n"
        "  pushq %rsi\n"
        "  .cfi_adjust_cfa_offset 8\n"
        "  subq $8, %rsp\n"
        "  .cfi_adjust_cfa_offset 8\n"
        "  call pump_dlsym_decide\n"
        "  addq $8, %rsp\n"
        "  .cfi_adjust_cfa_offset -8\n"
        "  popq %rsi\n"
        "  .cfi_adjust_cfa_offset -8\n"
        "  popq %rdi\n"
        "  .cfi_adjust_cfa_offset -8\n"
        "  testq %rax, %rax\n"
        "  jz 1f\n"
        "  ret\n"
        "1:\n"
        "  jmp *pump_real_dlsym_ptr(%rip)\n"
        "  .cfi_endproc\n"
        ".size dlsym, .-dlsym\n");
#elif defined(__aarch64__)
__asm__(".text\n"
        ".globl dlsym\n"
        ".type dlsym, %function\n"
        "dlsym:\n"
        "  .cfi_startproc\n"
        "  stp x29, x30, [sp, #-32]!\n"
        "  .cfi_def_cfa_offset 32\n"
        "  .cfi_offset 29, -32\n"
        "  .cfi_offset 30, -24\n"
        "  mov x29, sp\n"
        "  stp x0, x1, [sp, #16]\n"
        "  bl pump_dlsym_decide\n"
        "  mov x9, x0\n"
        "  ldp x0, x1, [sp, #16]\n"
        "  ldp x29, x30, [sp], #32\n"
        "  .cfi_def_cfa_offset 0\n"
        "  cbz x9, 1f\n"
        "  mov x0, x9\n"
        "  ret\n"
        "1:\n"
        "  adrp x16, pump_real_dlsym_ptr\n"
        "  ldr x16, [x16, #:lo12:pump_real_dlsym_ptr]\n"
        "  br x16\n"
        "  .cfi_endproc\n"
        ".size dlsym, .-dlsym\n");
#else
#error "pump's dlsym trampoline exists for x86_64 and aarch64 only"
#endif
