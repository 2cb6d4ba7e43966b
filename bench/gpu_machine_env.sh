# gpu_machine_env.sh: what every benchmark run script on the GPU machine sets up (sourced, not
# run): the bundle's programs and libraries, the CUDA and NCCL libraries of the machine's PyTorch,
# NVLink multicast off (it can take the shared machine out of service), the GPU count and the
# Python with torch. Needs $bundle.
source "$bundle/env.sh"
for d in /usr/local/cuda/lib64 /opt/torch/.venv/lib/python3*/site-packages/nvidia/nccl/lib \
         /opt/torch/.venv/lib/python3*/site-packages/nvidia/cu13/lib; do
  [ -d "$d" ] && export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$d
done
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
gpus=$(nvidia-smi --query-gpu=name --format=csv,noheader | wc -l)
py=/opt/torch/.venv/bin/python3
