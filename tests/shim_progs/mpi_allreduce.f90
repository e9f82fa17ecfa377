! A plain Fortran MPI program (`use mpi`) that knows nothing of inceptionn: one MPI_ALLREDUCE of
! N REAL values with MPI_SUM, the result written raw to OUTDIR/rankR_sum.bin.
! Usage: mpi_allreduce_f OUTDIR N
program mpi_allreduce_f
  use mpi
  implicit none
  real, allocatable :: x(:), y(:)
  integer :: ierr, rank, i, n, u
  character(len=4096) :: dir, arg
  call MPI_Init(ierr)
  call MPI_Comm_rank(MPI_COMM_WORLD, rank, ierr)
  call get_command_argument(1, dir)
  call get_command_argument(2, arg)
  read (arg, *) n
  allocate (x(n), y(n))
  do i = 1, n
    x(i) = 0.01 * sin(real(i) * 0.001 + real(rank)) / real(1 + mod(i / 65536, 7))
  end do
  call MPI_Allreduce(x, y, n, MPI_REAL, MPI_SUM, MPI_COMM_WORLD, ierr)
  write (arg, '(A,I0,A)') '/rank', rank, '_sum.bin'
  open (newunit=u, file=trim(dir)//trim(arg), access='stream', form='unformatted', status='replace')
  write (u) y
  close (u)
  call MPI_Finalize(ierr)
end program mpi_allreduce_f
