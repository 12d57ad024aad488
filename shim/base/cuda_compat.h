/* cuda_compat.h: libpump builds with the cuda.h of CUDA 13.0 (what PyTorch's CUDA build and the
 * GPU machine carry: nvidia-cuda-runtime 13.0.96) as well as later ones. The names newer than the
 * header in use that pump hooks or asks for are declared here with the prototypes of CUDA 13.5's
 * cuda.h and cudaTypedefs.h (nvidia-cuda-runtime 13.5.37); pump passes their arguments through
 * unread. With a header that has them, it adds nothing. */
#ifndef PUMP_CUDA_COMPAT_H
#define PUMP_CUDA_COMPAT_H

#include <cuda.h>
#include <cudaTypedefs.h>

#if CUDA_VERSION < 13010
/* Stream capture to CUDA in Graphics (13.1). */
typedef struct CUstreamCigCaptureParams_st CUstreamCigCaptureParams;
typedef CUresult(CUDAAPI *PFN_cuStreamBeginCaptureToCig_v13010)(CUstream hStream,
                                                                 CUstreamCigCaptureParams *streamCigCaptureParams);
typedef CUresult(CUDAAPI *PFN_cuStreamBeginCaptureToCig_v13010_ptsz)(
    CUstream hStream, CUstreamCigCaptureParams *streamCigCaptureParams);
typedef CUresult(CUDAAPI *PFN_cuStreamEndCaptureToCig_v13010)(CUstream hStream);
typedef CUresult(CUDAAPI *PFN_cuStreamEndCaptureToCig_v13010_ptsz)(CUstream hStream);
#endif

#if CUDA_VERSION < 13030
/* Recapture into an existing graph (13.3); the callback's status is an enum of that header. */
typedef CUresult(CUDA_CB *CUgraphRecaptureCallback)(void *data, CUgraphNode node,
                                                     const CUgraphNodeParams *originalParams,
                                                     const CUgraphNodeParams *recaptureParams, int status);
typedef CUresult(CUDAAPI *PFN_cuStreamBeginRecaptureToGraph_v13030)(CUstream hStream, CUstreamCaptureMode mode,
                                                                     CUgraph hGraph,
                                                                     CUgraphRecaptureCallback callbackFunc,
                                                                     void *userData);
typedef CUresult(CUDAAPI *PFN_cuStreamBeginRecaptureToGraph_v13030_ptsz)(CUstream hStream,
                                                                          CUstreamCaptureMode mode, CUgraph hGraph,
                                                                          CUgraphRecaptureCallback callbackFunc,
                                                                          void *userData);
#endif

#endif
