//! Connections accepted by our own listener, so that the reset fault can drop
//! one without a response: a handler flips its connection's switch and the
//! connection's next write fails, closing the socket with an RST.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::extract::connect_info::Connected;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};

pub(super) struct SimListener(pub(super) TcpListener);

impl axum::serve::Listener for SimListener {
    type Io = SimConn;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            match self.0.accept().await {
                Ok((io, addr)) => {
                    // Small request/response pairs: don't let Nagle hold them.
                    let _ = io.set_nodelay(true);
                    let conn = SimConn {
                        io,
                        kill: Arc::new(AtomicBool::new(false)),
                    };
                    return (conn, addr);
                }
                // A peer that gave up during the handshake: next.
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::ConnectionAborted
                            | io::ErrorKind::ConnectionReset
                            | io::ErrorKind::ConnectionRefused
                    ) => {}
                // Out of file descriptors and the like: back off instead of
                // spinning; connections in flight will free some.
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.0.local_addr()
    }
}

/// A connection whose writes can be made to fail from a handler.
pub(super) struct SimConn {
    io: TcpStream,
    kill: Arc<AtomicBool>,
}

impl SimConn {
    fn killed(&self) -> Option<io::Error> {
        if !self.kill.load(Ordering::Relaxed) {
            return None;
        }
        // An RST rather than a FIN: the client sees the connection die
        // instead of a clean close it might take for a keep-alive timeout.
        let _ = self.io.set_zero_linger();
        Some(io::Error::new(
            io::ErrorKind::ConnectionReset,
            "injected connection reset",
        ))
    }
}

impl AsyncRead for SimConn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for SimConn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if let Some(e) = self.killed() {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if let Some(e) = self.killed() {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if let Some(e) = self.killed() {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// The handler's handle on its connection's kill switch.
#[derive(Clone)]
pub(super) struct ConnCtl(Arc<AtomicBool>);

impl Connected<axum::serve::IncomingStream<'_, SimListener>> for ConnCtl {
    fn connect_info(stream: axum::serve::IncomingStream<'_, SimListener>) -> Self {
        ConnCtl(stream.io().kill.clone())
    }
}

impl ConnCtl {
    /// Makes the connection's next write fail with a reset.
    pub(super) fn kill(&self) {
        self.0.store(true, Ordering::Relaxed);
    }
}
