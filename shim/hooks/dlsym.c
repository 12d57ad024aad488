/* dlsym.c: the dlsym interposer, the door through which every program that
 * finds the driver at run time (the static CUDA runtime, cuda-python, Triton,
 * PyTorch) gets pump's hooks instead of libcuda's functions.
 *
 * Rules it follows (research/INTERPOSITION.md section 9):
 *  - the real dlsym comes from dlvsym(RTLD_NEXT, ...), never from the public
 *    dlsym (that would be ourselves), and dlvsym is not interposed
 *    (real_dlsym.c: the bootstrap reads one way, this file -> driver.c ->
 *    real_dlsym.c and stats.c, never back);
 *  - a lookup pump does not answer is forwarded as a TAIL JUMP from assembly,
 *    so glibc still sees the original caller (RTLD_NEXT is relative to it);
 *  - pump answers only exact names from its hook table, and only when the
 *    driver really has the symbol (otherwise the program sees what it would
 *    have seen without pump, NULL and dlerror() included: forwarded, an
 *    RTLD_DEFAULT lookup would find pump's own export, so pump answers NULL
 *    itself where nothing but pump defines the name and no libcuda is loaded);
 *  - a lookup made from inside one of pump's hooks (by the driver or a
 *    stacked interposer) is forwarded unchanged: it never comes back to pump.
 */
#include <dlfcn.h>
#include <link.h>
#include <string.h>

#include "captures.h"
#include "hooks_common.h"
#include "real_dlsym.h"

/* Read by the assembly trampoline below: the answer that means "forward the
 * lookup to the real dlsym" (pump_real_dlsym_ptr, real_dlsym.h). */
PUMP_HIDDEN const char pump_dlsym_forward[1];
#define FORWARD ((void *)pump_dlsym_forward)

static bool looks_like_driver_symbol(const char *name)
{
    return name != NULL && name[0] == 'c' && name[1] == 'u' && name[2] >= 'A' && name[2] <= 'Z';
}

/* An RTLD_DEFAULT lookup of a hooked name that nothing after pump defines.
 * Forwarded, it would find pump's own export, unless something before pump
 * defines it. Without pump it would fail, unless the caller's own scope has a
 * driver (a library dlopened with libcuda among its dependencies): then the
 * hook stands for that driver. */
static bool undefined_without_pump(pump_dlsym_fn real, const char *name, const void *caller)
{
    if (!pump_is_own_hook(real(RTLD_DEFAULT, name)))
        return false;
    Dl_info info;
    struct link_map *map = NULL;
    if (!dladdr1(caller, &info, (void **)&map, RTLD_DL_LINKMAP) || map == NULL)
        return true;
    void *scope = dlopen(map->l_name[0] != '\0' ? map->l_name : NULL, RTLD_NOW | RTLD_NOLOAD);
    if (scope == NULL)
        return true;
    void *found = real(scope, name);
    dlclose(scope);
    return found == NULL || pump_is_own_hook(found);
}

/* Called by the trampoline with dlsym's caller: the answer to return (the
 * hook, or NULL), or FORWARD to forward the lookup to the real dlsym unchanged. */
PUMP_HIDDEN void *pump_dlsym_decide(void *handle, const char *name, const void *caller)
{
    pump_dlsym_fn real = pump_real_dlsym();
    if (!looks_like_driver_symbol(name))
        return FORWARD;
    int id = pump_hook_depth > 0 ? -1 : pump_hook_find(name);  /* from inside a hook: forwarded */
    bool forward = id < 0 || atomic_load_explicit(&pump_passthrough, memory_order_relaxed);
    if (forward && pump_captures_begin_name(name))
        pump_captures_untracked("dlsym was asked for a capture's beginning that pump does not answer");
    if (forward)
        return FORWARD;
    /* Only answer where the driver answers: from pump's own position,
     * RTLD_DEFAULT would find pump's exports first, so look past them. */
    void *where = (handle == RTLD_DEFAULT) ? RTLD_NEXT : handle;
    if (real(where, name) != NULL) {
        PUMP_COUNT(dlsym_hooks, 1);
        if (pump_hook_is_launch(id))
            PUMP_COUNT(launch_lookups, 1);
        return pump_hooks[id].hook;
    }
    if (handle == RTLD_DEFAULT && undefined_without_pump(real, name, caller)) {
        real(RTLD_NEXT, name);  /* leaves dlerror() saying the symbol is undefined */
        return NULL;
    }
    return FORWARD;
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
        "  movq 24(%rsp), %rdx\n"
        "  call pump_dlsym_decide\n"
        "  addq $8, %rsp\n"
        "  .cfi_adjust_cfa_offset -8\n"
        "  popq %rsi\n"
        "  .cfi_adjust_cfa_offset -8\n"
        "  popq %rdi\n"
        "  .cfi_adjust_cfa_offset -8\n"
        "  leaq pump_dlsym_forward(%rip), %rcx\n"
        "  cmpq %rcx, %rax\n"
        "  je 1f\n"
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
        "  mov x2, x30\n"
        "  bl pump_dlsym_decide\n"
        "  mov x9, x0\n"
        "  ldp x0, x1, [sp, #16]\n"
        "  ldp x29, x30, [sp], #32\n"
        "  .cfi_def_cfa_offset 0\n"
        "  adrp x10, pump_dlsym_forward\n"
        "  add x10, x10, #:lo12:pump_dlsym_forward\n"
        "  cmp x9, x10\n"
        "  b.eq 1f\n"
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
